import { randomUUID } from 'node:crypto'
import { CairnProblem } from '@cairn/protocol'
import { iso } from '../clock.js'
import { releaseHold } from './hold-release.js'
import { HOLD_TOKEN_SEPARATOR, type SessionServiceDeps } from './session-deps.js'
import type { SessionRow, SessionStore } from './session-store.js'
import { MOVE_OPERATION, type TurnLocks } from './turn-locks.js'

/**
 * How long an exclusive operation's hold on a session lasts in the database unless renewed (it is,
 * every third of this, while the operation runs): what a replica that died holding one costs.
 */
const HOLD_MS = 60_000

/** What `WorkspaceAccess` works with: the session service's own store and locks, and its deps. */
export interface WorkspaceAccessDeps
  extends Pick<SessionServiceDeps, 'runtime' | 'logger' | 'relays' | 'clock'> {
  store: SessionStore
  locks: TurnLocks
  /** The session on this runtime, refused once deleted (`SessionService.requireLive`). */
  requireLive: (tenantId: string, id: string) => Promise<SessionRow>
}

/**
 * The ways in to a session's live workspace besides turns, and what they meet: reads through the
 * files API, writes through it, and exclusive operations (a restore, an import, a merge, a move)
 * held in this process and in the database so every replica sees them. A read or a write that
 * meets a swap or a deletion answers `session_busy` or `session_deleted`, never a wrong file.
 */
export class WorkspaceAccess {
  /** Deletions in progress: the workspace goes before the row says `deleted`. */
  readonly deleting = new Map<string, Promise<void>>()

  constructor(private readonly deps: WorkspaceAccessDeps) {}

  private get store(): SessionStore {
    return this.deps.store
  }

  private get locks(): TurnLocks {
    return this.deps.locks
  }

  private now(): string {
    return iso(this.deps.clock.now())
  }

  /**
   * Runs a read of a session's live workspace. A restore or an import renames it aside for a moment
   * and a deletion removes it before the row says so: a read that meets either answers
   * `session_busy` or `session_deleted`, not a 404, a 403 (its file seen outside the path) or a 500.
   */
  async readingWorkspace<T>(
    tenantId: string,
    id: string,
    read: () => Promise<T>,
    /** A walk over many entries (a listing, a diff): one that overlapped a swap may mix both trees. */
    walk = false,
  ): Promise<T> {
    // Only a swap moves the workspace: a read failing during a manual snapshot keeps its own error.
    const epoch = this.locks.swapEpoch(id)
    const swappingAtStart = this.locks.swapping(id)
    // A swap through another replica, as the database shows it: held, or started since.
    const shared = await this.store.swaps(id, this.now())
    const overlappedSwap = async () => {
      if (shared.swapping || this.locks.swapping(id) || this.locks.swapEpoch(id) !== epoch) return true
      if (swappingAtStart) return true
      const now = await this.store.swaps(id, this.now())
      return now.swapping || now.started !== shared.started
    }
    let result: T
    try {
      result = await read()
    } catch (error) {
      // Any failure of a read that overlapped a swap is the swap's doing, whatever it looked like.
      const overlapped = await overlappedSwap()
      const code = (error as { code?: unknown }).code
      if (overlapped || code === 'ENOENT' || code === 'not_found' || code === 'forbidden') {
        if (overlapped || this.deleting.has(id) || !(await this.deps.runtime.hasWorkspace(id)))
          throw await this.missingWorkspace(tenantId, id, overlapped)
      }
      if (code === 'ENOENT') throw new CairnProblem('not_found', 'no such file in the workspace')
      throw error
    }
    if (walk && (await overlappedSwap())) throw await this.missingWorkspace(tenantId, id, true)
    return result
  }

  /** The exclusive operation (e.g. "a restore") holding the session, if any. */
  busyWith(id: string): string | undefined {
    return this.locks.busyWith(id)
  }

  /**
   * What a workspace missing from the pool means. Concurrent requests see it missing for a moment
   * while a deletion or a restore's swap runs: those are `session_deleted` and `session_busy`
   * (retry), not `state_lost`, which is kept for a workspace that is really gone.
   */
  async missingWorkspace(tenantId: string, id: string, swapped = false): Promise<CairnProblem> {
    if (this.deleting.has(id) || (await this.store.get(tenantId, id))?.status === 'deleted')
      return new CairnProblem('session_deleted', `session ${id} was deleted`)
    // Held here, or through another replica (its hold is in the database).
    const op = this.busyWith(id) ?? (await this.store.heldFor(id, this.now()))
    if (op) return new CairnProblem('session_busy', `session ${id} is busy with ${op}; retry when it is done`)
    // Missing a moment ago and there now: a swap (through any replica) ended meanwhile.
    if (swapped || (await this.deps.runtime.hasWorkspace(id)))
      return new CairnProblem(
        'session_busy',
        `the workspace of session ${id} was replaced (a restore or an import) while it was read; retry`,
      )
    return new CairnProblem('state_lost', `the workspace of session ${id} is missing from the storage pool`)
  }

  /**
   * Runs `fn` holding the session's turn lock, so no message starts meanwhile; refuses with
   * `session_busy` while a turn runs.
   */
  async exclusive<T>(
    tenantId: string,
    id: string,
    what: string,
    fn: (row: SessionRow) => Promise<T>,
    swapsWorkspace = false,
  ): Promise<T> {
    const row = await this.deps.requireLive(tenantId, id)
    // A deletion under way waits for the operations it found; one begun after it would run on a
    // workspace being deleted (a snapshot answered 500 storage_error).
    if (this.deleting.has(id)) throw new CairnProblem('session_deleted', `session ${id} was deleted`)
    if (this.locks.has(id)) {
      throw new CairnProblem(
        'session_busy',
        `session ${id} is running a turn; ${what} must wait for it or cancel it`,
      )
    }
    if (this.locks.changingFiles(id)) {
      throw new CairnProblem(
        'session_busy',
        `session ${id} has a file write in progress; retry ${what} after it`,
      )
    }
    // This process's lock first (taken at once after the checks above, nothing awaited between),
    // then the database's, which other replicas see.
    return this.locks.holdExclusive(
      id,
      what,
      () => this.heldInDatabase(id, { operation: what, swapsWorkspace }, () => fn(row)),
      swapsWorkspace,
    )
  }

  /**
   * Runs `fn` with the session held in the database too: replicas share it, and a turn begun
   * through another one (which cannot see this process's locks) is refused while `fn` runs. The
   * hold is renewed while it lasts; a replica that died with it holds it as long as its lease
   * (the leader releases it then, as it ends its turns), `HOLD_MS` at most.
   */
  private async heldInDatabase<T>(
    id: string,
    hold: { operation: string; swapsWorkspace: boolean },
    fn: () => Promise<T>,
  ): Promise<T> {
    const what = hold.operation
    // A replica's hold names its lease: the leader releases it once that lease is over.
    const relayId = this.deps.relays?.relayId
    const token = relayId ? `${relayId}${HOLD_TOKEN_SEPARATOR}${randomUUID()}` : randomUUID()
    const release = () =>
      releaseHold(
        () => this.store.releaseHold(id, token),
        { session: id, operation: what },
        { untilMs: Date.now() + HOLD_MS, logger: this.deps.logger },
      )
    let refused: Awaited<ReturnType<SessionStore['hold']>>
    try {
      refused = await this.store.hold(id, hold, token, this.now(), HOLD_MS)
    } catch (error) {
      // Unanswered, the hold may still have been taken: it is let go once the database answers.
      void release()
      throw error
    }
    if (refused && 'turnRunning' in refused)
      throw new CairnProblem(
        'session_busy',
        `session ${id} is running a turn; ${what} must wait for it or cancel it`,
      )
    if (refused)
      throw refused.heldFor === MOVE_OPERATION
        ? new CairnProblem(
            'session_moving',
            `session ${id} is being moved to another node; retry in a moment`,
          )
        : new CairnProblem(
            'session_busy',
            `session ${id} is busy with ${refused.heldFor}; retry when it is done`,
          )
    const renewal = setInterval(() => {
      this.store
        .renewHold(id, token, this.now(), HOLD_MS)
        .then((renewed) => {
          if (!renewed)
            this.deps.logger.error(
              { session: id, operation: what },
              'a session hold lapsed while its operation runs: other replicas may act on the session',
            )
        })
        .catch((error: unknown) =>
          this.deps.logger.warn({ err: error, session: id }, 'renewing a session hold failed'),
        )
    }, HOLD_MS / 3)
    renewal.unref()
    try {
      return await fn()
    } finally {
      clearInterval(renewal)
      await release()
    }
  }

  /**
   * Runs a change to the live workspace through the files API. A restore or an import swaps the
   * workspace: a write meeting one would land in the copy being replaced (lost) or find no
   * workspace at all, so it answers `session_busy` instead, and no such operation starts while
   * a write is in flight.
   */
  async changingWorkspace<T>(id: string, fn: () => Promise<T>): Promise<T> {
    const before = await this.store.swaps(id, this.now())
    const op = this.busyWith(id) ?? before.heldFor
    if (op) throw new CairnProblem('session_busy', `session ${id} is busy with ${op}; retry when it is done`)
    // Through another replica a swap cannot see this write in flight: one that started meanwhile
    // may have left the write in the copy it replaced, so the write is not answered as done.
    const metSwap = async () => {
      const after = await this.store.swaps(id, this.now())
      return after.swapping || after.started !== before.started
    }
    const replaced = () =>
      new CairnProblem(
        'session_busy',
        `the workspace of session ${id} was replaced (a restore or an import) while it was written; write again`,
      )
    let result: T
    try {
      result = await this.locks.holdFileChange(id, fn)
    } catch (error) {
      // Any failure of a write that met a swap is the swap's doing (a path missing for a moment).
      if (await metSwap()) throw replaced()
      // One that met a delete found its workspace gone: the session's state, not a server fault.
      if (this.deleting.has(id) || (await this.store.statusOf(id)) === 'deleted')
        throw new CairnProblem('session_deleted', `session ${id} was deleted while its workspace was written`)
      throw error
    }
    if (await metSwap()) throw replaced()
    return result
  }
}
