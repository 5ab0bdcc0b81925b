import { Errors } from '@sinclair/typebox/errors'
import { InvalidResponseError } from './errors.js'
import type { Validator } from './validator.js'
import * as valid from './validators.js'

/**
 * Checks a response against the protocol's own schema (the one the server answers by): the wire is
 * described once. The check is the schema's, compiled by TypeBox when the SDK is built
 * (validators.ts); a body that does not match becomes an `InvalidResponseError` (`invalid_response`)
 * naming the first mismatch, as TypeBox's `Errors` finds it in the schema. Unknown extra fields pass
 * (a newer server may add some).
 */
export function checked<T>(validator: Validator<T>, value: unknown, what: string): T {
  if (validator.check(value)) return value as T
  const { schema, references } = validator.schema()
  const first = Errors(schema, references, value).First()
  const where = first ? `: ${first.path || '/'} ${first.message}` : ''
  throw new InvalidResponseError({
    code: 'invalid_response',
    message: `the server sent an unexpected ${what}${where}`,
  })
}

export const asSession = (v: unknown) => checked(valid.Session, v, 'session')
export const asAgent = (v: unknown) => checked(valid.Agent, v, 'agent')
export const asRevision = (v: unknown) => checked(valid.Revision, v, 'revision')
export const asAgentDetail = (v: unknown) => checked(valid.AgentDetail, v, 'agent')
export const asDeployResult = (v: unknown) => checked(valid.DeployResult, v, 'deploy result')
export const asMessage = (v: unknown) => checked(valid.Message, v, 'message')
export const asTurn = (v: unknown) => checked(valid.Turn, v, 'turn')
export const asStatusEvent = (v: unknown) => checked(valid.StatusEvent, v, 'status event')

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
