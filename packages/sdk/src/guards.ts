import {
  AgentDetailSchema,
  AgentSchema,
  DeployResultSchema,
  MessageSchema,
  RevisionSchema,
  SessionSchema,
  StatusEventSchema,
  TurnSchema,
} from '@cairn/protocol'
import type { Static, TSchema } from '@sinclair/typebox'
// TypeBox's interpreter (no code generation, so no `unsafe-eval` under a browser's CSP).
import { Value } from '@sinclair/typebox/value'
import { InvalidResponseError } from './errors.js'

/**
 * Checks a response against the protocol's own schema (the one the server answers by): the wire is
 * described once. A body that does not match becomes an `InvalidResponseError` (`invalid_response`)
 * naming the first mismatch. Unknown extra fields pass (a newer server may add some).
 */
export function checked<S extends TSchema>(schema: S, value: unknown, what: string): Static<S> {
  if (Value.Check(schema, value)) return value
  const first = Value.Errors(schema, value).First()
  const where = first ? `: ${first.path || '/'} ${first.message}` : ''
  throw new InvalidResponseError({
    code: 'invalid_response',
    message: `the server sent an unexpected ${what}${where}`,
  })
}

export const asSession = (v: unknown) => checked(SessionSchema, v, 'session')
export const asAgent = (v: unknown) => checked(AgentSchema, v, 'agent')
export const asRevision = (v: unknown) => checked(RevisionSchema, v, 'revision')
export const asAgentDetail = (v: unknown) => checked(AgentDetailSchema, v, 'agent')
export const asDeployResult = (v: unknown) => checked(DeployResultSchema, v, 'deploy result')
export const asMessage = (v: unknown) => checked(MessageSchema, v, 'message')
export const asTurn = (v: unknown) => checked(TurnSchema, v, 'turn')
export const asStatusEvent = (v: unknown) => checked(StatusEventSchema, v, 'status event')

const isRecord = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v)

/** A `{ data: [...] }` list whose every item is checked by `item`. */
export function asList<T>(v: unknown, item: (x: unknown) => T, what: string): T[] {
  if (!isRecord(v) || !Array.isArray(v.data)) {
    throw new InvalidResponseError({
      code: 'invalid_response',
      message: `the server sent an unexpected ${what}`,
    })
  }
  return v.data.map(item)
}

export function asCursor(v: unknown): string | undefined {
  return isRecord(v) && typeof v.nextCursor === 'string' ? v.nextCursor : undefined
}
