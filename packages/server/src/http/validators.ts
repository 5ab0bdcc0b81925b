import { AjvCompiler } from '@fastify/ajv-compiler'
import type { FastifySchemaCompiler, FastifyServerOptions } from 'fastify'

type BuildValidator = NonNullable<
  NonNullable<NonNullable<FastifyServerOptions['schemaController']>['compilersFactory']>['buildValidator']
>
type AjvServerOptions = { customOptions?: Record<string, unknown>; plugins?: unknown[] }

/**
 * Validators per request part. A JSON body is validated as typed: `false`, `""` or `null` where a
 * number is asked for is refused, never coerced (Ajv's coercion made `null` a TTL of 0 and
 * `false` "no limit"). Query strings, path parameters and headers are text on the wire, so they
 * keep Fastify's coercion (`?limit=5` is the number 5). Both are Fastify's own Ajv compiler, with
 * the server's Ajv options; only `coerceTypes` differs.
 */
export function typedBodyValidators(): BuildValidator {
  const pool = AjvCompiler()
  const build = (externalSchemas: unknown, options: unknown) => {
    const server = (options ?? {}) as AjvServerOptions
    const text = pool(externalSchemas as never, server as never) as unknown as FastifySchemaCompiler<unknown>
    const typed = pool(
      externalSchemas as never,
      {
        ...server,
        customOptions: { ...server.customOptions, coerceTypes: false },
      } as never,
    ) as unknown as FastifySchemaCompiler<unknown>
    const compile: FastifySchemaCompiler<unknown> = (route) =>
      route.httpPart === 'body' ? typed(route) : text(route)
    return compile
  }
  return build as unknown as BuildValidator
}
