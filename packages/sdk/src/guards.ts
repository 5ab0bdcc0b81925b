import type {
  AgentDetail,
  AgentInfo,
  DeployResult,
  Message,
  RevisionInfo,
  SessionInfo,
  StatusEvent,
  TurnInfo,
} from '@cairn/protocol'
import { InvalidResponseError } from './errors.js'

type Kind = 'string' | 'number' | 'boolean' | 'array' | 'string?'
type Shape = Record<string, Kind>

const isRecord = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v)

function matches(value: unknown, shape: Shape): value is Record<string, unknown> {
  if (!isRecord(value)) return false
  for (const [key, kind] of Object.entries(shape)) {
    const field = value[key]
    if (
      kind === 'array'
        ? !Array.isArray(field)
        : kind === 'string?'
          ? field !== null && typeof field !== 'string'
          : typeof field !== kind
    ) {
      return false
    }
  }
  return true
}

/** Checks the fields the SDK and CLI rely on; the server's schemas guarantee the rest. */
function expect<T>(value: unknown, shape: Shape, what: string): T {
  if (!matches(value, shape)) {
    throw new InvalidResponseError({
      code: 'invalid_response',
      message: `the server sent an unexpected ${what}`,
    })
  }
  return value as T
}

const SESSION: Shape = {
  id: 'string',
  agentId: 'string',
  agentName: 'string',
  status: 'string',
  title: 'string?',
  turnCount: 'number',
}
const AGENT: Shape = { id: 'string', name: 'string', currentRevisionId: 'string?', command: 'array' }
const REVISION: Shape = { id: 'string', agentId: 'string', status: 'string' }
const MESSAGE: Shape = { role: 'string', content: 'string', turn: 'number' }
const TURN: Shape = { id: 'string', seq: 'number', status: 'string' }
const STATUS_EVENT: Shape = { to: 'string', cause: 'string', at: 'string' }

export const asSession = (v: unknown) => expect<SessionInfo>(v, SESSION, 'session')
export const asAgent = (v: unknown) => expect<AgentInfo>(v, AGENT, 'agent')
export const asRevision = (v: unknown) => expect<RevisionInfo>(v, REVISION, 'revision')
export const asAgentDetail = (v: unknown) => expect<AgentDetail>(v, { ...AGENT, revisions: 'array' }, 'agent')

export function asDeployResult(v: unknown): DeployResult {
  const body = expect<Record<string, unknown>>(v, {}, 'deploy result')
  return { agent: asAgent(body.agent), revision: asRevision(body.revision) }
}

export function asList<T>(v: unknown, item: (x: unknown) => T, what: string): T[] {
  const body = expect<{ data: unknown[] }>(v, { data: 'array' }, what)
  return body.data.map(item)
}

export const asMessage = (v: unknown) => expect<Message>(v, MESSAGE, 'message')
export const asTurn = (v: unknown) => expect<TurnInfo>(v, TURN, 'turn')
export const asStatusEvent = (v: unknown) => expect<StatusEvent>(v, STATUS_EVENT, 'status event')

export function asCursor(v: unknown): string | undefined {
  return isRecord(v) && typeof v.nextCursor === 'string' ? v.nextCursor : undefined
}
