import {
  CairnProblem,
  type Message,
  type NetworkEventInfo,
  type SessionInfo,
  type SessionList,
  type SessionStatus,
  type StatusEvent,
  type TurnInfo,
} from '@cairn/protocol'
import { iso } from '../clock.js'
import { decodeCursor, encodeCursor } from './cursor.js'
import type { SessionServiceDeps } from './session-deps.js'
import { type SessionRow, SessionStore, type StoredTurn, toSessionInfo } from './session-store.js'
import type { WarmAgents } from './warm-agents.js'

/**
 * The part of `SessionService` that finds and reads sessions: one by ID (refused as the caller may
 * not use it: not found, on another runtime, deleted), by prefix, a page of them, and what each
 * holds (messages, status events, network log, turns). Nothing here changes a session.
 */
export abstract class SessionReads {
  readonly store: SessionStore
  /** The warm agents: a session's info says whether its sandbox is warm. */
  protected abstract readonly warm: WarmAgents

  constructor(protected readonly deps: SessionServiceDeps) {
    this.store = new SessionStore(
      deps.db,
      deps.runtimeId,
      deps.routing && ((id) => deps.routing?.placedNode(id)),
    )
  }

  protected now(): string {
    return iso(this.deps.clock.now())
  }

  protected async info(row: SessionRow): Promise<SessionInfo> {
    return toSessionInfo(row, await this.warm.has(row.id).catch((error: unknown) => this.unreachable(error)))
  }

  /**
   * A session's row is answered whatever its node's state: a node lost or out of reach (an API
   * replica's routing) only means its sandbox is not known to be warm.
   */
  private unreachable(error: unknown): false {
    const code = error instanceof CairnProblem ? error.code : undefined
    if (code === 'node_lost' || code === 'node_unavailable' || code === 'node_fenced') return false
    throw error
  }

  async require<R extends SessionRow = SessionRow>(
    tenantId: string,
    id: string,
    read: (tenantId: string, id: string) => Promise<R | undefined> = (t, i) =>
      this.store.get(t, i) as Promise<R | undefined>,
  ): Promise<R> {
    const row = await read.call(this.store, tenantId, id)
    if (!row) throw new CairnProblem('session_not_found', `No session found matching '${id}'`)
    return row
  }

  /**
   * The session, for an operation on its runtime (its sandbox, workspace or snapshots): refused
   * with `session_elsewhere` (retryable, naming the owner) when another replica's runtime holds it.
   */
  async requireOwned<R extends SessionRow = SessionRow>(
    tenantId: string,
    id: string,
    read?: (tenantId: string, id: string) => Promise<R | undefined>,
  ): Promise<R> {
    const row = await this.require<R>(tenantId, id, read)
    // An API replica routes every session to its node.
    if (this.deps.routing) return row
    if (row.runtime_id !== null && row.runtime_id !== this.deps.runtimeId)
      throw new CairnProblem(
        'session_elsewhere',
        `session ${id} lives on runtime ${row.runtime_id}, not on this server's (${this.deps.runtimeId}); send the request to the server of that runtime`,
        { runtimeId: row.runtime_id },
      )
    return row
  }

  /** The session on this runtime, refused with `session_deleted` once it was deleted (its row stays). */
  async requireLive(tenantId: string, id: string): Promise<SessionRow> {
    const row = await this.requireOwned(tenantId, id)
    if (row.status === 'deleted') throw new CairnProblem('session_deleted', `session ${id} was deleted`)
    return row
  }

  async get(tenantId: string, id: string): Promise<SessionInfo> {
    return this.info(await this.require(tenantId, id))
  }

  async list(
    tenantId: string,
    query: {
      agent?: string | undefined
      status?: SessionStatus | undefined
      limit?: number | undefined
      cursor?: string | undefined
    },
  ): Promise<SessionList> {
    const limit = query.limit ?? 50
    const agentId = query.agent ? (await this.deps.agents.require(tenantId, query.agent)).id : undefined
    const rows = await this.store.list(tenantId, {
      agentId,
      status: query.status,
      limit: limit + 1,
      cursor: query.cursor ? decodeCursor(query.cursor) : undefined,
    })
    const page = rows.slice(0, limit)
    const last = page[page.length - 1]
    return {
      data: await Promise.all(page.map((row) => this.info(row))),
      nextCursor: rows.length > limit && last ? encodeCursor(last.created_at, last.id) : null,
    }
  }

  async resolve(tenantId: string, rawPrefix: string): Promise<SessionInfo> {
    const prefix = rawPrefix.startsWith('ses_') ? rawPrefix : `ses_${rawPrefix}`
    if (!/^ses_[0-9a-z]*$/.test(prefix)) {
      throw new CairnProblem('session_not_found', `No session found matching '${rawPrefix}'`)
    }
    const matches = await this.store.resolvePrefix(tenantId, prefix, 6)
    if (matches.length === 0)
      throw new CairnProblem('session_not_found', `No session found matching '${rawPrefix}'`)
    if (matches.length > 1) {
      throw new CairnProblem('ambiguous_id', `Ambiguous ID '${rawPrefix}' — matches: ${matches.join(', ')}`, {
        matches,
      })
    }
    return this.get(tenantId, matches[0] as string)
  }

  async messages(tenantId: string, id: string): Promise<Message[]> {
    await this.require(tenantId, id)
    return this.store.messages(id)
  }

  async events(tenantId: string, id: string): Promise<StatusEvent[]> {
    await this.require(tenantId, id)
    return this.store.events(id)
  }

  async network(tenantId: string, id: string, limit = 500): Promise<NetworkEventInfo[]> {
    await this.require(tenantId, id)
    return this.store.networkLog.recent(id, limit)
  }

  async turns(tenantId: string, id: string): Promise<TurnInfo[]> {
    await this.require(tenantId, id)
    return this.store.turns(id)
  }

  /** A turn of the tenant's by its ID alone (`not_found` for another tenant's, as for none). */
  async turn(tenantId: string, turnId: string): Promise<StoredTurn> {
    const turn = await this.store.turnById(turnId)
    // The store reads a session by tenant and ID: another tenant's is none.
    if (!turn || !(await this.store.get(tenantId, turn.sessionId)))
      throw new CairnProblem('not_found', `No turn '${turnId}'`)
    return turn
  }
}
