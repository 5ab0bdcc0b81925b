import { type Static, Type } from '@sinclair/typebox'
import { Value } from '@sinclair/typebox/value'
import { type RawBuilder, sql } from 'kysely'
import type { Logger } from 'pino'
import type { Db } from '../db/database.js'
import { DedicatedConnection } from './dedicated-connection.js'

/** The channel every replica and node LISTENs on. */
export const CLUSTER_CHANNEL = 'cairn_cluster'
/** The listening connection's `application_name`. */
export const HINTS_APPLICATION_NAME = 'cairn-hints'

/**
 * What crosses `cairn_cluster`: hints only (everything is also in the tables), so a hint lost
 * while a listener reconnects costs latency, never correctness.
 */
export const ClusterHintSchema = Type.Union([
  /** Cancel a running turn (the replica streaming it, or the node running it, acts). */
  Type.Object({ kind: Type.Literal('turn.cancel'), sessionId: Type.String(), turnId: Type.String() }),
  /**
   * A preview URL epoch went up (a port's, or without `port` the whole session's): connections
   * relayed to it are closed by whichever replica relays them.
   */
  Type.Object({
    kind: Type.Literal('preview.revoke'),
    sessionId: Type.String(),
    port: Type.Optional(Type.Integer()),
  }),
  /** A turn's events up to `id` were written (replicas streaming it to a resumed client read them). */
  Type.Object({ kind: Type.Literal('turn.events'), turnId: Type.String(), id: Type.Integer() }),
  /** An API key was revoked: every replica forgets it had verified it. */
  Type.Object({ kind: Type.Literal('key.revoke'), keyId: Type.String() }),
  /** A node's state changed (registered, cordoned, drained, stopped). */
  Type.Object({
    kind: Type.Literal('node.state'),
    nodeId: Type.String(),
    state: Type.String(),
    epoch: Type.Integer(),
  }),
  /** The leader declared a node lost: these turns failed with `node_lost` (streams end now). */
  Type.Object({
    kind: Type.Literal('node.lost'),
    nodeId: Type.String(),
    epoch: Type.Integer(),
    turns: Type.Array(Type.Object({ sessionId: Type.String(), turnId: Type.String() })),
  }),
])
export type ClusterHint = Static<typeof ClusterHintSchema>

/**
 * What a holder of remembered state needs of the hints: to publish one, to hear them, and to know
 * whether it may have missed one (then what it remembers is not to be trusted).
 */
export interface HintFeed {
  publish(hint: ClusterHint): Promise<void>
  /**
   * `hint` as an expression to put in a statement of one's own, which then publishes it (one
   * round trip for a write and its hint; delivered on commit, as `publish`'s).
   */
  notification(hint: ClusterHint): RawBuilder<unknown>
  subscribe(listener: (hint: ClusterHint) => void): Promise<() => void>
  /**
   * Names the current unbroken stretch of listening: it changes whenever hints may have been
   * missed (the connection dropped, or a probe of it failed), and is undefined while none are
   * being received. State remembered in one stretch is good only in the same one.
   */
  readonly continuity: number | undefined
  /** `listener` is called each time listening starts again after hints may have been missed. */
  onResumed(listener: () => void): void
}

/** NOTIFY's payload limit is 8000 bytes; a larger hint is cut to what still says enough. */
const MAX_PAYLOAD_BYTES = 7900

/**
 * Publishes hints (through the pool, inside the caller's transaction if there is one: NOTIFY is
 * delivered on commit) and delivers the ones received to subscribers (one dedicated LISTEN
 * connection, reconnected when it drops, and probed every `probeMs`: a partition never errors by
 * itself, and a listener cut off unknowingly would miss hints while trusting what it remembers).
 */
export class ClusterHints implements HintFeed {
  private readonly listeners = new Set<(hint: ClusterHint) => void>()
  private readonly resumedListeners: (() => void)[] = []
  private connection: DedicatedConnection | undefined
  private retry: NodeJS.Timeout | undefined
  private probe: NodeJS.Timeout | undefined
  private closed = false
  private stretch = 0
  private listening = false

  constructor(
    private readonly deps: {
      db: Db
      url: string
      logger: Logger
      reconnectMs?: number
      probeMs?: number
    },
  ) {}

  get continuity(): number | undefined {
    return this.listening ? this.stretch : undefined
  }

  onResumed(listener: () => void): void {
    this.resumedListeners.push(listener)
  }

  async publish(hint: ClusterHint): Promise<void> {
    await sql`SELECT ${this.notification(hint)}`.execute(this.deps.db.q)
  }

  notification(hint: ClusterHint): RawBuilder<unknown> {
    let payload = JSON.stringify(hint)
    if (Buffer.byteLength(payload) > MAX_PAYLOAD_BYTES && hint.kind === 'node.lost')
      payload = JSON.stringify({ ...hint, turns: [] })
    return sql`pg_notify(${CLUSTER_CHANNEL}, ${payload})`
  }

  /** Calls `listener` with every valid hint received; the first subscriber starts listening. */
  async subscribe(listener: (hint: ClusterHint) => void): Promise<() => void> {
    this.listeners.add(listener)
    if (!this.connection) await this.listen()
    return () => this.listeners.delete(listener)
  }

  private async listen(): Promise<void> {
    const connection = new DedicatedConnection(this.deps.url, {
      connectTimeoutMs: 5000,
      queryTimeoutMs: 5000,
      applicationName: HINTS_APPLICATION_NAME,
    })
    this.connection = connection
    connection.onLost(() => {
      this.interrupted()
      this.scheduleReconnect()
    })
    try {
      const client = await connection.open()
      // Closed while connecting: this connection is the last one and must not outlive `close`.
      if (this.closed) {
        await connection.close()
        return
      }
      client.on('notification', (message) => {
        if (message.channel !== CLUSTER_CHANNEL || !message.payload) return
        let hint: unknown
        try {
          hint = JSON.parse(message.payload)
        } catch {
          return
        }
        if (!Value.Check(ClusterHintSchema, hint)) {
          this.deps.logger.warn(
            { payload: message.payload.slice(0, 200) },
            'ignored a malformed cluster hint',
          )
          return
        }
        for (const listener of this.listeners) listener(hint)
      })
      await connection.query(`LISTEN ${CLUSTER_CHANNEL}`)
      if (this.closed) {
        await connection.close()
        return
      }
      if (this.connection !== connection || !connection.connected) return
      this.stretch++
      this.listening = true
      this.startProbe(connection)
      for (const listener of this.resumedListeners) listener()
    } catch (error) {
      this.interrupted()
      if (this.closed) return
      this.deps.logger.warn({ err: error }, 'could not listen for cluster hints; trying again')
      this.scheduleReconnect()
    }
  }

  /** Hints may be missed from now on: what was remembered in the last stretch is stale. */
  private interrupted(): void {
    if (this.listening) this.stretch++
    this.listening = false
    if (this.probe) clearInterval(this.probe)
    this.probe = undefined
  }

  private startProbe(connection: DedicatedConnection): void {
    if (this.probe) clearInterval(this.probe)
    this.probe = setInterval(() => {
      // A failed or timed-out probe drops the connection (onLost: interrupted, reconnect); a
      // dropped one is never opened again by a probe.
      if (connection.connected) connection.query('SELECT 1').catch(() => connection.drop())
    }, this.deps.probeMs ?? 5000)
    this.probe.unref()
  }

  private scheduleReconnect(): void {
    if (this.closed || this.retry) return
    this.retry = setTimeout(() => {
      this.retry = undefined
      const old = this.connection
      this.connection = undefined
      void old?.close().then(() => (this.closed ? undefined : this.listen()))
    }, this.deps.reconnectMs ?? 1000)
    this.retry.unref()
  }

  async close(): Promise<void> {
    this.closed = true
    this.interrupted()
    if (this.retry) clearTimeout(this.retry)
    this.listeners.clear()
    await this.connection?.close()
  }
}
