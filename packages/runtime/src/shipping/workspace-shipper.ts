import { randomBytes } from 'node:crypto'
import { existsSync } from 'node:fs'
import { mkdir } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import { BtrfsOps } from '../storage/btrfs-ops.js'
import { type StoragePool, safeName } from '../storage/pool.js'
import { OneAtATime } from '../util/one-at-a-time.js'
import { treeDigest } from '../workspace-io/digest.js'
import type { ShippingBucket } from './bucket.js'
import { type ChainLink, chainKey, streamPrefix, type TreeKind } from './chain-link.js'
import { readChainHead } from './chain-reader.js'
import { type ExpectedHead, type RestoredWorkspace, restoreFromBucket } from './restore.js'
import { type PartObserver, shipToolOutput } from './stream-parts.js'
import { checkTreeId, fetchTree, receiveTree, shipTree } from './tree-shipping.js'
import { btrfsSend, tarCreate } from './tree-streams.js'

/** What shipping reports, for logs and metrics (passed in by the composition root). */
export interface ShippingObserver {
  /** A chain link was confirmed in the bucket. */
  shipped?(event: { sessionId: string; link: ChainLink; durationMs: number }): void
  /** A ship failed; it is tried again after `retryInMs` (with the newest snapshot by then). */
  failed?(event: { sessionId: string; error: CairnProblem; attempt: number; retryInMs: number }): void
  /** A part of a stream was confirmed in the bucket. */
  partUploaded?(event: { sessionId?: string | undefined; key: string; bytes: number; index: number }): void
}

export interface WorkspaceShipperOptions {
  pool: StoragePool
  bucket: ShippingBucket
  /**
   * A chain is at most this many links: a full stream, then up to `fullEvery - 1` increments, then
   * a full again (so a restore reads a bounded number of streams). 1: every link is full.
   */
  fullEvery?: number
  /** Streams are cut into part objects of this size (default 64 MiB). */
  partBytes?: number
  /** The first retry waits this long, doubling up to `retryMaxMs` (defaults 500 ms, 30 s). */
  retryInitialMs?: number
  retryMaxMs?: number
  observer?: ShippingObserver
  /**
   * Asked just before a link is written: false drops the snapshot unshipped (the session is no
   * longer this node's: a stale owner must not continue the new owner's chain).
   */
  mayShip?: (sessionId: string, snapshotId: string) => Promise<boolean>
  /** Where a revision, image or environment lives (revisions and environments have defaults). */
  locateTree?: (kind: TreeKind, id: string) => string
}

/**
 * How far shipping is behind: snapshots taken and not yet confirmed in the bucket, and for how long;
 * and how many sessions' shipping is failing (its last attempt failed, `shipping_failed` when the
 * store is down or hung: retried with backoff until one succeeds).
 */
export interface ShippingLag {
  unshippedSnapshots: number
  secondsBehind: number
  failingSessions: number
}

interface Job {
  snapshotId: string
  /** The enqueue count when it was enqueued: confirming it confirms every one before it. */
  number: number
  sinceMs: number
}

interface SessionState {
  /** The newest confirmed link (null: nothing shipped; undefined: not read from the bucket yet). */
  head: ChainLink | null | undefined
  pending: Job | undefined
  inFlight: Job | undefined
  enqueued: number
  confirmed: number
  running: Promise<void> | undefined
  /** Failed attempts in a row (0: the last attempt succeeded, or none was made). */
  attempt: number
  idle: (() => void)[]
}

const DEFAULTS = { fullEvery: 16, partBytes: 64 * 1024 * 1024, retryInitialMs: 500, retryMaxMs: 30_000 }

/**
 * Ships each session's snapshots to the bucket as a chain (docs/shipping.md): the newest snapshot
 * enqueued, as `btrfs send -p <last shipped>` (or a full stream for the first link, every
 * `fullEvery`-th, and when the last shipped snapshot is gone from the pool), or a full tar stream
 * on the `dir` driver. One worker per session, latest wins: a turn only enqueues, and snapshots
 * taken while one ships are coalesced into the newest. Failures are retried with backoff.
 */
export class WorkspaceShipper {
  private readonly sessions = new Map<string, SessionState>()
  private readonly markers = new BtrfsOps(1)
  private readonly restores = new OneAtATime()
  private readonly settings: typeof DEFAULTS
  private closed = false
  private readonly sleeping = new Set<() => void>()

  constructor(private readonly options: WorkspaceShipperOptions) {
    this.settings = {
      fullEvery: options.fullEvery ?? DEFAULTS.fullEvery,
      partBytes: options.partBytes ?? DEFAULTS.partBytes,
      retryInitialMs: options.retryInitialMs ?? DEFAULTS.retryInitialMs,
      retryMaxMs: options.retryMaxMs ?? DEFAULTS.retryMaxMs,
    }
    if (!Number.isInteger(this.settings.fullEvery) || this.settings.fullEvery < 1)
      throw new CairnProblem('validation_failed', 'fullEvery must be a whole number of at least 1')
  }

  /** Asks for `snapshotId` (a snapshot of the session's workspace in the pool) to be shipped; never waits. */
  enqueue(sessionId: string, snapshotId: string): void {
    safeName(sessionId)
    safeName(snapshotId)
    if (this.closed) return
    const state = this.state(sessionId)
    state.pending = { snapshotId, number: ++state.enqueued, sinceMs: state.pending?.sinceMs ?? Date.now() }
    if (!state.running) state.running = this.work(sessionId, state)
  }

  /** The generation of the newest snapshot confirmed in the bucket (undefined: none). */
  async shippedGeneration(sessionId: string): Promise<number | undefined> {
    return (await this.head(sessionId, this.state(sessionId)))?.generation
  }

  /** The newest confirmed chain link of a session (read from the bucket the first time). */
  async shippedHead(sessionId: string): Promise<ChainLink | undefined> {
    return (await this.head(sessionId, this.state(sessionId))) ?? undefined
  }

  /** Shipping lag of one session, or the worst over all sessions (the metric). */
  lag(sessionId?: string): ShippingLag {
    const states = sessionId ? [this.sessions.get(sessionId)] : [...this.sessions.values()]
    const now = Date.now()
    let unshippedSnapshots = 0
    let failingSessions = 0
    let oldest = now
    for (const state of states) {
      if (!state) continue
      unshippedSnapshots += state.enqueued - state.confirmed
      if (state.attempt > 0) failingSessions++
      for (const job of [state.inFlight, state.pending]) if (job) oldest = Math.min(oldest, job.sinceMs)
    }
    return { unshippedSnapshots, secondsBehind: (now - oldest) / 1000, failingSessions }
  }

  /** Resolves once the session has nothing left to ship (or the shipper is closed). */
  async flush(sessionId: string): Promise<void> {
    const state = this.sessions.get(sessionId)
    if (!state?.running) return
    await new Promise<void>((resolve) => state.idle.push(resolve))
  }

  /** Ships a revision, image or dependency environment once (skipped when the bucket has it). */
  async shipTree(kind: TreeKind, id: string): Promise<{ shipped: boolean }> {
    const { shipped } = await shipTree(
      this.options.bucket,
      kind,
      id,
      this.treePath(kind, id),
      this.settings.partBytes,
      this.partObserver(),
    )
    return { shipped }
  }

  /**
   * Fetches a shipped revision, image or environment to where this pool keeps it: a revision or
   * environment is unpacked into a staging tree of the pool and sealed read-only as the pool seals
   * its own (a subvolume on btrfs), in its tenant's quota group; an image unpacked where
   * `locateTree` says.
   */
  async fetchTree(kind: TreeKind, id: string, tenantId?: string): Promise<void> {
    const { pool, bucket } = this.options
    const target = this.treePath(kind, id)
    if (kind === 'image') {
      await fetchTree(bucket, kind, id, target)
      return
    }
    if (existsSync(target)) throw new CairnProblem('conflict', `${kind} ${id} is already in the pool`)
    const staging = await pool.createStaging(`fetch_${randomBytes(6).toString('hex')}`, tenantId)
    try {
      await receiveTree(bucket, kind, id, staging)
      if (kind === 'revision') await pool.sealRevision(staging, id, tenantId)
      else {
        await mkdir(path.dirname(target), { recursive: true })
        await pool.sealStaging(staging, target, tenantId)
      }
    } catch (error) {
      await pool.discardStaging(staging).catch(() => undefined)
      throw error
    }
  }

  /**
   * Restores the session's workspace in this shipper's pool from the expected link, else its newest
   * confirmed one (see `restoreFromBucket`); shipping then continues that chain from the restored snapshot.
   */
  restoreFromBucket(
    sessionId: string,
    tenantId?: string,
    expectedHead?: ExpectedHead,
  ): Promise<RestoredWorkspace> {
    // One restore of a session at a time: two (two replicas recovering it at once) received into
    // the same staging directory and each broke the other's tree.
    return this.restores.run(sessionId, () => this.restoreNow(sessionId, tenantId, expectedHead))
  }

  private async restoreNow(
    sessionId: string,
    tenantId?: string,
    expectedHead?: ExpectedHead,
  ): Promise<RestoredWorkspace> {
    const state = this.state(sessionId)
    if (state.running) await this.flush(sessionId)
    const restored = await restoreFromBucket(this.options.bucket, sessionId, this.options.pool, {
      tenantId,
      expectedHead,
    })
    state.head = restored.head
    return restored
  }

  /** Stops every worker after its current step; pending snapshots are left unshipped. */
  async close(): Promise<void> {
    this.closed = true
    for (const wake of this.sleeping) wake()
    await Promise.all([...this.sessions.values()].map((state) => state.running))
    this.markers.close()
  }

  private state(sessionId: string): SessionState {
    let state = this.sessions.get(sessionId)
    if (!state) {
      state = {
        head: undefined,
        pending: undefined,
        inFlight: undefined,
        enqueued: 0,
        confirmed: 0,
        running: undefined,
        attempt: 0,
        idle: [],
      }
      this.sessions.set(sessionId, state)
    }
    return state
  }

  private async head(sessionId: string, state: SessionState): Promise<ChainLink | null> {
    if (state.head === undefined) state.head = (await readChainHead(this.options.bucket, sessionId)) ?? null
    return state.head
  }

  /** The session's worker: ships the newest pending snapshot until none is left. */
  private async work(sessionId: string, state: SessionState): Promise<void> {
    while (state.pending && !this.closed) {
      const job = state.pending
      state.pending = undefined
      state.inFlight = job
      try {
        // A snapshot deleted before its turn came is not counted as shipped: the lag says so.
        if (await this.shipSnapshot(sessionId, state, job.snapshotId))
          state.confirmed = Math.max(state.confirmed, job.number)
        state.attempt = 0
      } catch (error) {
        const problem =
          error instanceof CairnProblem ? error : new CairnProblem('storage_error', (error as Error).message)
        // The failed one goes back unless a newer snapshot came meanwhile (it carries the change too);
        // the lag keeps counting from the older one.
        const newer = state.pending as Job | undefined
        state.pending = newer ? { ...newer, sinceMs: job.sinceMs } : job
        // A link number taken by another writer means this head is stale: read it again.
        if (problem.code === 'shipping_conflict') state.head = undefined
        state.attempt++
        const retryInMs = Math.min(
          this.settings.retryMaxMs,
          this.settings.retryInitialMs * 2 ** Math.min(state.attempt - 1, 20),
        )
        this.options.observer?.failed?.({ sessionId, error: problem, attempt: state.attempt, retryInMs })
        await this.sleep(retryInMs)
      } finally {
        state.inFlight = undefined
      }
    }
    state.running = undefined
    for (const resolve of state.idle.splice(0)) resolve()
  }

  /** Ships one snapshot as the next link of the session's chain; resolves once the link is confirmed. */
  private async shipSnapshot(sessionId: string, state: SessionState, snapshotId: string): Promise<boolean> {
    const { pool, bucket } = this.options
    const started = performance.now()
    const head = await this.head(sessionId, state)
    if (head?.snapshotId === snapshotId) return true
    // Deleted before its turn came (a newer one is queued, or retention took it): nothing to ship.
    if (!(await pool.hasSnapshot(snapshotId))) return false
    const dir = pool.snapshotPath(snapshotId)
    const [generation] = await this.markers.getGenerations([dir])
    if (generation === undefined)
      throw new CairnProblem('storage_error', `snapshot ${snapshotId} carries no workspace generation marker`)
    // Read beside the send: the digest and the stream both only read the read-only snapshot.
    const digesting = treeDigest(dir)
    digesting.catch(() => undefined)
    const seq = (head?.seq ?? 0) + 1
    const parent =
      pool.driver === 'btrfs' &&
      head &&
      head.driver === 'btrfs' &&
      seq - head.baseSeq < this.settings.fullEvery &&
      (await pool.hasSnapshot(head.snapshotId))
        ? head
        : undefined
    const under = streamPrefix(sessionId, seq, randomBytes(6).toString('hex'))
    const tool =
      pool.driver === 'btrfs'
        ? btrfsSend(dir, parent ? pool.snapshotPath(parent.snapshotId) : undefined)
        : tarCreate(dir)
    const format = pool.driver === 'btrfs' ? 'btrfs-send' : 'tar'
    const stream = await shipToolOutput(
      bucket,
      under,
      tool,
      format,
      this.settings.partBytes,
      this.partObserver(sessionId),
    )
    const link: ChainLink = {
      format: 'cairn.chain-link',
      version: 1,
      sessionId,
      seq,
      baseSeq: parent ? parent.baseSeq : seq,
      kind: parent ? 'increment' : 'full',
      driver: pool.driver,
      snapshotId,
      ...(parent ? { parentSnapshotId: parent.snapshotId } : {}),
      generation,
      treeDigest: await digesting,
      stream,
      shippedAt: new Date().toISOString(),
    }
    if (this.options.mayShip && !(await this.options.mayShip(sessionId, snapshotId))) return false
    // Written last and once: a reader sees this link only with every part of its stream in place.
    await bucket.putOnce(chainKey(sessionId, seq), Buffer.from(JSON.stringify(link)), 'application/json')
    state.head = link
    this.options.observer?.shipped?.({ sessionId, link, durationMs: performance.now() - started })
    return true
  }

  private partObserver(sessionId?: string): PartObserver | undefined {
    const observer = this.options.observer?.partUploaded
    return observer ? (part) => observer({ sessionId, ...part }) : undefined
  }

  private treePath(kind: TreeKind, id: string): string {
    checkTreeId(kind, id)
    if (this.options.locateTree) return this.options.locateTree(kind, id)
    const { pool } = this.options
    if (kind === 'revision') return pool.revisionPath(id)
    if (kind === 'environment') return path.join(pool.root, 'envs', id)
    throw new CairnProblem('unavailable', `the shipper was given no place for trees of kind ${kind}`)
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const wake = () => {
        clearTimeout(timer)
        this.sleeping.delete(wake)
        resolve()
      }
      const timer = setTimeout(wake, ms)
      this.sleeping.add(wake)
    })
  }
}
