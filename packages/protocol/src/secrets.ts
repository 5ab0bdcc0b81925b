import { Type } from '@sinclair/typebox'

/** A secret as listed: its name and scope, never its value. */
export const SecretInfoSchema = Type.Object({
  name: Type.String(),
  scope: Type.String(),
  hosts: Type.Optional(Type.Array(Type.String())),
  /** Proxy scope: the extra headers its stand-in is swapped into, besides the credential headers. */
  headers: Type.Optional(Type.Array(Type.String())),
  createdAt: Type.String(),
  updatedAt: Type.String(),
  /** When it stops being injected and is deleted by the retention pass; null: never. */
  expiresAt: Type.Union([Type.String(), Type.Null()]),
})

/** An agent's secrets, and the ones its cairn.yaml requires that are not set yet. */
export const SecretListSchema = Type.Object({
  data: Type.Array(SecretInfoSchema),
  missing: Type.Array(Type.String()),
})
