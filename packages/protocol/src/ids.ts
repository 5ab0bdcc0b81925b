/** Prefixed identifiers: the prefix tells what a thing is, the body is 20 random base32 characters. */
export const ID_PREFIXES = {
  agent: 'agt_',
  revision: 'rev_',
  session: 'ses_',
  turn: 'trn_',
  snapshot: 'snap_',
  apiKey: 'key_',
  tenant: 'tnt_',
  request: 'req_',
  event: 'evt_',
  artifact: 'art_',
  sandbox: 'sbx_',
  runtime: 'rt_',
  /** One process of an API replica (cluster): its lease and the turns it relays. */
  replica: 'rpl_',
  /** Space a tenant's storage budget holds for a copy under way. */
  reservation: 'rsv_',
  /** A tenant's webhook endpoint. */
  webhook: 'whk_',
  /** One message to one webhook endpoint, with its attempts. */
  webhookDelivery: 'whd_',
  /** A webhook message (the `webhook-id` header): one event, the same on every endpoint and attempt. */
  webhookMessage: 'msg_',
  /** A command run in a session's sandbox outside a turn. */
  command: 'cmd_',
  /** An agent's request for a human's approval (human review). */
  approval: 'apr_',
} as const

export type IdKind = keyof typeof ID_PREFIXES
export type IdPrefix = (typeof ID_PREFIXES)[IdKind]

const ALPHABET = '0123456789abcdefghjkmnpqrstvwxyz' // Crockford base32, lower case
const BODY_LENGTH = 20

/**
 * Random bytes drawn from the platform's CSPRNG a block at a time: one `getRandomValues` call per
 * 204 IDs instead of one per ID (a warm turn makes three, and each call crossed into the runtime's
 * crypto). Each byte is used once.
 */
const POOL_BYTES = BODY_LENGTH * 204
const pool = new Uint8Array(POOL_BYTES)
let poolOffset = POOL_BYTES

export function newId(kind: IdKind): string {
  if (poolOffset + BODY_LENGTH > POOL_BYTES) {
    globalThis.crypto.getRandomValues(pool)
    poolOffset = 0
  }
  let body = ''
  for (let i = poolOffset; i < poolOffset + BODY_LENGTH; i++) body += ALPHABET[(pool[i] as number) & 31]
  poolOffset += BODY_LENGTH
  return ID_PREFIXES[kind] + body
}

const ID_PATTERN = new RegExp(`^[a-z]+_[${ALPHABET}]{${BODY_LENGTH}}$`)

export function isId(kind: IdKind, value: string): boolean {
  return value.startsWith(ID_PREFIXES[kind]) && ID_PATTERN.test(value)
}

/** Short form shown in tables: the prefix and the first 8 body characters (12 characters for sessions). */
export function shortId(id: string): string {
  const underscore = id.indexOf('_')
  return underscore < 0 ? id.slice(0, 12) : id.slice(0, underscore + 1 + 8)
}
