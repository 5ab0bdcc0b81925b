import { readFile } from 'node:fs/promises'
import type { NodeState } from '@cairn/protocol'
import type { Logger } from 'pino'
import type { Db } from '../db/database.js'
import type { ClusterHint } from './cluster-hints.js'
import { DedicatedConnection, NODE_LOCK_CLASS } from './dedicated-connection.js'
import { type NodeFigures, NodeStore } from './node-store.js'
import { SelfFence } from './self-fence.js'

export const DEFAULT_HEARTBEAT_MS = 1000
export const DEFAULT_LEASE_MS = 5000

export interface NodeRegistryOptions {
  db: Db
  /** The database URL: the node's dedicated connection (its liveness lock, its heartbeats). */
  databaseUrl: string
  /** The node's runtime ID. */
  nodeId: string
  name: string
  /** Where API replicas reach the node's runtime port. */
  address: string
  /** The node's figures now (drivers, CPUs, warm sandboxes, pool space). */
  figures: () => Promise<NodeFigures>
  /** Stops every sandbox (the port's `stopAllAgents`): what fencing does. */
  stopAllAgents: () => Promise<void>
  heartbeatMs?: number
  leaseMs?: number
  logger: Logger
  /** Hints published when the node's state changes (registered, stopped). */
  publish?: (hint: ClusterHint) => Promise<void>
  /** Told when the node fences itself and when it is live again. */
  onFenceChange?: (fenced: boolean, reason: string) => void
}

/** The boot ID of this machine (a new one after a reboot); `unknown` where the kernel has none. */
export async function machineBootId(): Promise<string> {
  return (await readFile('/proc/sys/kernel/random/boot_id', 'utf8').catch(() => 'unknown')).trim()
}

/**
 * A node's registration and liveness: its row in `nodes` (one more epoch at each registration),
 * a session-level advisory lock held on a connection of its own for the node's life (the leader
 * sees a crashed node at once: the lock is free), and a lease renewed every `heartbeatMs` only
 * for this incarnation (`WHERE id = ? AND epoch = ?`). When it cannot renew before the lease ends
 * the node fences itself (`SelfFence`); when the database answers again, or after it was declared
 * lost, it registers again with a new epoch.
 */
export class NodeRegistry {
  readonly fence: SelfFence
  private readonly connection: DedicatedConnection
  private readonly store: NodeStore
  private readonly heartbeatMs: number
  private readonly leaseMs: number
  private epochNow: number | undefined
  private stateNow: NodeState | undefined
  private lockHeld = false
  private timer: NodeJS.Timeout | undefined
  private ticking: Promise<void> | undefined
  private stopped = false

  constructor(private readonly options: NodeRegistryOptions) {
    this.heartbeatMs = options.heartbeatMs ?? DEFAULT_HEARTBEAT_MS
    this.leaseMs = options.leaseMs ?? DEFAULT_LEASE_MS
    if (this.heartbeatMs * 2 > this.leaseMs)
      throw new Error(
        `the lease (${this.leaseMs} ms) must be at least two heartbeats (${this.heartbeatMs} ms) long`,
      )
    // Statements on the node's connection give up well before the lease ends.
    const timeoutMs = Math.max(100, Math.floor(this.leaseMs / 2))
    this.connection = new DedicatedConnection(options.databaseUrl, {
      connectTimeoutMs: timeoutMs,
      queryTimeoutMs: timeoutMs,
    })
    this.connection.onLost(() => {
      if (this.lockHeld) options.logger.warn('the node lost its database connection (and its liveness lock)')
      this.lockHeld = false
    })
    this.store = new NodeStore(options.db, (query) => this.connection.query(query.sql, query.parameters))
    this.fence = new SelfFence(this.leaseMs, {
      stopAllAgents: options.stopAllAgents,
      logger: options.logger,
      onChange: options.onFenceChange,
    })
  }

  /** The incarnation registered now (undefined before the first registration or while fenced). */
  get epoch(): number | undefined {
    return this.fence.isFenced() ? undefined : this.epochNow
  }

  get state(): NodeState | undefined {
    return this.stateNow
  }

  /** Whether the node must refuse port calls. */
  isFenced(): boolean {
    return this.fence.isFenced()
  }

  /** Registers (throws if the database cannot be reached), then heartbeats until `stop()`. */
  async start(): Promise<number> {
    const epoch = await this.register()
    this.schedule()
    return epoch
  }

  private schedule(): void {
    if (this.stopped) return
    this.timer = setTimeout(() => {
      this.ticking = this.tick().finally(() => {
        this.ticking = undefined
        this.schedule()
      })
    }, this.heartbeatMs)
  }

  /** Takes the liveness lock on the node's connection (waiting out an older connection of ours). */
  private async lock(): Promise<void> {
    if (this.lockHeld && this.connection.connected) return
    const until = performance.now() + this.leaseMs
    for (;;) {
      const [row] = await this.connection.query<{ locked: boolean }>(
        'SELECT pg_try_advisory_lock($1, hashtext($2)) AS locked',
        [NODE_LOCK_CLASS, this.options.nodeId],
      )
      if (row?.locked) {
        this.lockHeld = true
        return
      }
      // Held by a connection of this node's that the server has not seen die yet, or by the
      // leader probing it this instant.
      if (performance.now() > until)
        throw new Error(`the liveness lock of node ${this.options.nodeId} is held by another connection`)
      await new Promise((resolve) => setTimeout(resolve, Math.min(100, this.heartbeatMs)))
    }
  }

  private async register(): Promise<number> {
    await this.lock()
    const figures = await this.options.figures()
    // The lease runs from the statement that grants it, not from the wait for the lock before it:
    // counted from before that wait, a slow lock (a loaded machine) ended the new lease at once, and
    // the node fenced itself and registered once more (one incarnation too many).
    const sentAt = performance.now()
    const { epoch, state } = await this.store.register({
      id: this.options.nodeId,
      name: this.options.name,
      address: this.options.address,
      bootId: await machineBootId(),
      figures,
      leaseMs: this.leaseMs,
    })
    this.epochNow = epoch
    this.stateNow = state
    this.fence.renewed(sentAt)
    this.options.logger.info({ node: this.options.nodeId, epoch, state }, 'node registered')
    await this.options
      .publish?.({ kind: 'node.state', nodeId: this.options.nodeId, state, epoch })
      .catch(() => {})
    return epoch
  }

  /** One heartbeat: renew (or, fenced, register again). Failures wait for the next one. */
  private async tick(): Promise<void> {
    try {
      if (this.fence.isFenced()) {
        await this.fence.fence('fenced')
        await this.register()
        return
      }
      // Without the lock the leader may already count the node crashed: renewing alone proves nothing.
      await this.lock()
      const epoch = this.epochNow
      if (epoch === undefined) return
      const { warmSandboxes, poolFreeBytes } = await this.options.figures()
      // The renewed lease runs from the statement that renews it (see `register`).
      const sentAt = performance.now()
      const state = await this.store.renew(this.options.nodeId, epoch, this.leaseMs, {
        warmSandboxes,
        poolFreeBytes,
      })
      if (state === undefined) {
        // Declared lost (or stopped) meanwhile: its sessions' epochs went up, its sandboxes are stale.
        await this.fence.fence(`incarnation ${epoch} no longer holds a lease (declared lost)`)
        return
      }
      this.stateNow = state
      // Fenced while the renewal was under way: only a new registration ends that.
      if (!this.fence.isFenced()) this.fence.renewed(sentAt)
    } catch (error) {
      if (!this.stopped)
        this.options.logger.warn(
          { err: error, fenced: this.fence.isFenced() },
          'node heartbeat failed; trying again at the next one',
        )
    }
  }

  /** A clean shutdown: heartbeats stop, the row says `stopped`, the lock and connection go. */
  async stop(): Promise<void> {
    this.stopped = true
    if (this.timer) clearTimeout(this.timer)
    await this.ticking
    const epoch = this.epochNow
    const wasLive = !this.fence.isFenced()
    this.fence.close()
    if (epoch !== undefined && wasLive) {
      try {
        if (await this.store.deregister(this.options.nodeId, epoch)) {
          this.stateNow = 'stopped'
          await this.options
            .publish?.({ kind: 'node.state', nodeId: this.options.nodeId, state: 'stopped', epoch })
            .catch(() => {})
        }
      } catch (error) {
        this.options.logger.warn({ err: error }, 'could not deregister the node (its lease will end)')
      }
    }
    await this.connection.close()
  }
}
