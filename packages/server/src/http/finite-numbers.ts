import { CairnProblem } from '@cairn/protocol'
import type { FastifyInstance } from 'fastify'

/**
 * Where a validated request part holds a number that is not finite, or undefined. Ajv's type
 * coercion (needed for query strings) turns the strings "Infinity" and "1e400" into `Infinity`
 * and then lets them through `integer` and `maximum`: such a value would be stored and break the
 * answer's serialisation (and every later list) with a 500. Walks iteratively: bodies of routes
 * without a schema may be nested arbitrarily deep.
 */
export function nonFiniteNumberAt(value: unknown): string | undefined {
  const stack: [unknown, string][] = [[value, '']]
  while (stack.length > 0) {
    const [current, at] = stack.pop() as [unknown, string]
    if (typeof current === 'number') {
      if (!Number.isFinite(current)) return at || '/'
    } else if (current !== null && typeof current === 'object' && !Buffer.isBuffer(current)) {
      for (const [key, child] of Object.entries(current)) stack.push([child, `${at}/${key}`])
    }
  }
  return undefined
}

/** Refuses requests whose query, path parameters or body carry a non-finite number after coercion. */
export function refuseNonFiniteNumbers(app: FastifyInstance): void {
  app.addHook('preHandler', async (request) => {
    for (const [part, value] of [
      ['querystring', request.query],
      ['params', request.params],
      ['body', request.body],
    ] as const) {
      const at = nonFiniteNumberAt(value)
      if (at !== undefined)
        throw new CairnProblem('validation_failed', `${part}${at === '/' ? '' : at} must be a finite number`)
    }
  })
}
