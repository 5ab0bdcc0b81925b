import { Type } from '@sinclair/typebox'

export const ErrorBodySchema = Type.Object({
  error: Type.Object({
    code: Type.String(),
    message: Type.String(),
    requestId: Type.Optional(Type.String()),
    details: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
  }),
})

/**
 * The largest integer a JSON number carries exactly: the ceiling of request integers that have no
 * smaller one (above it PostgreSQL's BIGINT refused the value with a 500, and JavaScript rounds it).
 */
export const MAX_EXACT_INTEGER = Number.MAX_SAFE_INTEGER

/**
 * The pattern of text a process is given (an argument, an environment value): a C string, so it
 * holds no NUL (a sandbox's environment reaches bwrap NUL-separated, where one would add options).
 */
export const NO_NUL_PATTERN = '^[^\\u0000]*$'

export const IdParams = Type.Object({ id: Type.String({ minLength: 1, maxLength: 200 }) })

export const OkSchema = Type.Object({ ok: Type.Boolean() })

export const HealthSchema = Type.Object({ ok: Type.Boolean(), version: Type.String() })
