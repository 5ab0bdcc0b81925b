/**
 * The model of the model-based fault test: what a client was told, per session. A file's
 * content is known exactly once a write was acknowledged (a turn that completed, an API write
 * that answered 2xx); a write whose answer never came (a fault, a cancel, a dropped stream) may
 * or may not have landed (a turn's, in part), so the model keeps every content the path may hold.
 */

/** Paths the generated operations write (the agent's turns and the files API alike). */
export const PATHS = ['a.txt', 'b.txt', 'c.bin'] as const
export type FilePath = (typeof PATHS)[number]

/** A file's bytes as base64, or null for "absent". */
export type Content = string | null

/** Per path, every content the workspace may hold there. */
export type Files = Map<FilePath, Set<Content>>

export const ENDED_STATUSES = ['completed', 'failed', 'timeout']

/** Status causes that name a loss of workspace state. */
export const LOSS_CAUSES = ['state_lost', 'node_recovered']

/** A session's event as `GET …/events` lists it. */
export interface SessionEvent {
  to: string
  cause: string
  detail: string | null
}

/**
 * Whether the event names a loss: `state_lost`, or a recovery from the shipping bucket (`node_recovered`)
 * but for one that says nothing was lost.
 */
export function namesLoss(event: SessionEvent): boolean {
  if (!LOSS_CAUSES.includes(event.cause)) return false
  return !(event.cause === 'node_recovered' && event.detail?.endsWith("no turn's changes were lost"))
}

export interface RetentionModel {
  keepAutoSnapshots: number
  endedSnapshotTtlMs: number | null
  endedWorkspaceTtlMs: number | null
}

/** A TTL this short may fire while a sequence runs (the server sweeps retention every 60 s). */
export const RETENTION_HORIZON_MS = 10 * 60_000

export interface SnapshotModel {
  id: string
  files: Files
  /**
   * The session may have moved to another node since it was taken (a move, a drain, a recovery
   * after a node or PostgreSQL fault): a move carries the workspace, not earlier snapshots, so
   * a restore or fork of it may be refused `409 snapshot_left_behind` (docs/cluster.md).
   */
  mayBeLeftBehind?: boolean
}

export interface SessionModel {
  id: string
  /** s0, s1 … in the order the sequence made them (for readable failure reports). */
  label: string
  files: Files
  /** Manual snapshots, oldest first, with the files each stands for. */
  snapshots: SnapshotModel[]
  /** Deleted by the sequence (DELETE) or, where the model allowed it, by retention. */
  deleted: boolean
  /** The status the last look at the session found. */
  lastStatus: string
  /** Retention may delete its workspace / its snapshots: it was seen ended under a short TTL. */
  retentionMayDelete: boolean
  retentionMayDeleteSnapshots: boolean
  /** Loss events (LOSS_CAUSES) already accounted for. */
  lossEvents: number
}

export function emptyFiles(): Files {
  return new Map(PATHS.map((p) => [p, new Set<Content>([null])]))
}

export function copyFiles(files: Files): Files {
  return new Map([...files].map(([p, set]) => [p, new Set(set)]))
}

/** Files that may be either `a` or `b` (an operation that may or may not have happened). */
export function eitherFiles(a: Files, b: Files): Files {
  return new Map(PATHS.map((p) => [p, new Set([...(a.get(p) ?? []), ...(b.get(p) ?? [])])]))
}

export class Model {
  readonly sessions: SessionModel[] = []
  retention: RetentionModel = { keepAutoSnapshots: 10, endedSnapshotTtlMs: null, endedWorkspaceTtlMs: null }

  /** Sessions not deleted, in creation order. */
  live(): SessionModel[] {
    return this.sessions.filter((s) => !s.deleted)
  }

  /** The live session `index` picks (modulo their number), if there is one. */
  pick(index: number): SessionModel | undefined {
    const live = this.live()
    return live.length === 0 ? undefined : live[index % live.length]
  }

  add(id: string, files: Files): SessionModel {
    const session: SessionModel = {
      id,
      label: `s${this.sessions.length}`,
      files,
      snapshots: [],
      deleted: false,
      lastStatus: 'idle',
      retentionMayDelete: false,
      retentionMayDeleteSnapshots: false,
      lossEvents: 0,
    }
    this.sessions.push(session)
    return session
  }

  /** A write the client was told succeeded: the path holds exactly `content`. */
  acknowledged(session: SessionModel, path: FilePath, content: Content): void {
    session.files.set(path, new Set([content]))
  }

  /** A write whose outcome the client never learnt: the path may hold `content` too. */
  unacknowledged(session: SessionModel, path: FilePath, content: Content): void {
    session.files.get(path)?.add(content)
  }

  /**
   * A turn's write whose turn did not complete (cancelled, failed, its stream lost): the path may
   * hold `content`, or any start of it (none at all included). This is the server's contract, not
   * a loss: a turn's writes are the agent's own, made by its processes, and stopping them (a
   * cancel, a stop, a fault) leaves the workspace as they left it (a shell's `> a.txt` truncates
   * before anything is written; no rollback, the snapshot before the turn is the undo). Only
   * writes through the API are all or nothing (`PUT …/files/content` stages and renames). A
   * cancel 15 ms into a turn left `a.txt` empty: CI's seed 650280898, path 1.
   */
  interrupted(session: SessionModel, path: FilePath, content: Content): void {
    const bytes = Buffer.from(content ?? '', 'base64')
    const set = session.files.get(path)
    for (let length = 0; length <= bytes.length; length++)
      set?.add(bytes.subarray(0, length).toString('base64'))
  }

  /** The sessions (every live one when not given) may have moved to another node. */
  mayHaveMoved(session?: SessionModel): void {
    for (const one of session ? [session] : this.live())
      for (const snapshot of one.snapshots) snapshot.mayBeLeftBehind = true
  }

  /** Records the session's status as seen, and what retention may now do to it. */
  seen(session: SessionModel, status: string): void {
    session.lastStatus = status
    if (!ENDED_STATUSES.includes(status)) return
    const short = (ttl: number | null) => ttl !== null && ttl <= RETENTION_HORIZON_MS
    if (short(this.retention.endedWorkspaceTtlMs)) session.retentionMayDelete = true
    if (short(this.retention.endedSnapshotTtlMs)) session.retentionMayDeleteSnapshots = true
  }
}

export function describeSet(set: Set<Content> | undefined): string {
  const all = [...(set ?? [])].map((c) => (c === null ? 'absent' : short(c)))
  // An interrupted turn's write allows every start of its bytes: name a few and the count.
  const shown = all.length > 8 ? [...all.slice(0, 6), `… ${all.length} in all`] : all
  return `{${shown.join(', ')}}`
}

export function short(content: Content): string {
  if (content === null) return 'absent'
  const text = Buffer.from(content, 'base64').toString('latin1')
  return JSON.stringify(text.length > 24 ? `${text.slice(0, 24)}…` : text)
}
