import { Type } from '@sinclair/typebox'

export const ErrorBodySchema = Type.Object({
  error: Type.Object({
    code: Type.String(),
    message: Type.String(),
    requestId: Type.Optional(Type.String()),
    details: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
  }),
})

export const IdParams = Type.Object({ id: Type.String({ minLength: 1, maxLength: 200 }) })

export const OkSchema = Type.Object({ ok: Type.Boolean() })

export const HealthSchema = Type.Object({ ok: Type.Boolean(), version: Type.String() })
