import { AjvCompiler } from '@fastify/ajv-compiler'
import type { FastifySchemaCompiler, FastifyServerOptions } from 'fastify'

type BuildValidator = NonNullable<
  NonNullable<NonNullable<FastifyServerOptions['schemaController']>['compilersFactory']>['buildValidator']
>
type AjvServerOptions = { customOptions?: Record<string, unknown>; plugins?: unknown[] }

/**
 * The server's Ajv options. verbose: an issue carries the schema that holds it, so an unknown
 * field's answer can name the nearest known one (the schema and value are dropped from the answer;
 * see http/errors.ts). Coercion applies to the parts that are text on the wire; JSON bodies are
 * validated as typed (`typedBodyValidators`).
 */
export const AJV_OPTIONS = {
  removeAdditional: false,
  coerceTypes: 'array',
  useDefaults: true,
  verbose: true,
} as const

const standalonePool = AjvCompiler()

/** A validator's answer: whether the value holds, and Ajv's issues when it does not. */
export type Validate = ((value: unknown) => boolean) & { errors?: unknown[] | null }

/**
 * Compiles `schema` as a route's JSON body is compiled (the same Ajv options, no coercion), for
 * input that arrives as JSON outside a route's body (an MCP tool's arguments).
 */
export function typedValidator(schema: unknown): Validate {
  // One Ajv for all of them: the pool keeps one per set of options.
  const compile = standalonePool({}, { customOptions: { ...AJV_OPTIONS, coerceTypes: false } } as never)
  return (compile as unknown as (route: { schema: unknown; httpPart: string }) => Validate)({
    schema,
    httpPart: 'body',
  })
}

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
