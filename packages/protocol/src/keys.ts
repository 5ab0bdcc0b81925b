import { Type } from '@sinclair/typebox'

/**
 * An API key as listed: never the key itself, only its first characters. `role` is `admin` or
 * `read` today; the wire says string so a client keeps working when a role is added.
 */
export const ApiKeyInfoSchema = Type.Object({
  id: Type.String(),
  prefix: Type.String(),
  role: Type.String(),
  name: Type.Union([Type.String(), Type.Null()]),
  tenantId: Type.String(),
  createdAt: Type.String(),
  lastUsedAt: Type.Union([Type.String(), Type.Null()]),
  revokedAt: Type.Union([Type.String(), Type.Null()]),
})

export const ApiKeyListSchema = Type.Object({ data: Type.Array(ApiKeyInfoSchema) })

/** A new key: `key` is the secret, answered this once only. */
export const CreatedApiKeySchema = Type.Object({
  id: Type.String(),
  key: Type.String(),
  tenantId: Type.String(),
  role: Type.String(),
})
