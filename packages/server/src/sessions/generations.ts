import { CairnProblem } from '@cairn/protocol'
import type { RuntimePort } from '@cairn/runtime/port'
import { whenNotBusy } from '../db/busy.js'
import type { SessionRow, SessionStore } from './session-store.js'

type Checked = Pick<SessionRow, 'id' | 'status' | 'status_cause'>

/**
 * Workspace generations: a number that only moves forward, kept in the database and as a marker
 * inside the workspace (an xattr on its root, see `StoragePool.writeGeneration`). The marker is always written first, so a crash between the
 * two leaves the disk ahead (accepted) and never behind; a workspace behind the database was
 * rolled back or replaced outside Cairn, and is refused with `state_lost`.
 */
export class WorkspaceGenerations {
  constructor(
    private readonly store: SessionStore,
    private readonly runtime: RuntimePort,
    private readonly now: () => string,
  ) {}

  /**
   * Refuses (`state_lost`) a workspace that is missing or older than the last recorded generation.
   * `busy`: whether the session's lock is held meanwhile (a restore swaps the subvolume, so for an
   * instant it is absent; that is reported as `session_busy`, not as a loss). It never writes: a
   * workspace without a marker (a pool from before markers) is given one by the start-up check,
   * when nothing else runs.
   */
  async verify(row: Checked, busy: () => boolean): Promise<void> {
    // The database first, then the disk: every writer puts the marker down before the database,
    // so a change landing between the two reads can only make the disk look newer, never older.
    const recorded = await this.store.generationOf(row.id)
    if (!(await this.runtime.hasWorkspace(row.id))) {
      if (busy())
        throw new CairnProblem('session_busy', `session ${row.id} is changing its workspace; try again`)
      const message = `the workspace of session ${row.id} is missing from the storage pool`
      await this.markLost(row, message)
      throw new CairnProblem('state_lost', message)
    }
    const [onDisk] = await this.runtime.readGenerations([row.id])
    // Behind what was read first: a recovery of the session from its node's last shipped snapshot
    // (which `hasWorkspace` may have set off) records the generation it came back at, and names
    // what did not make it; that is the generation to compare with, not a loss to report again.
    const now = onDisk !== undefined && onDisk < recorded ? await this.store.generationOf(row.id) : recorded
    const problem = await this.compare(row, onDisk, now)
    if (problem) throw problem
  }

  /** The start-up check of every workspace at once; returns the sessions found behind. */
  async verifyAll(sessions: (Checked & { generation: number })[]): Promise<string[]> {
    const found = await this.runtime.readGenerations(sessions.map((s) => s.id))
    const lost: string[] = []
    for (const [index, session] of sessions.entries()) {
      const onDisk = found[index]
      if (onDisk === undefined) await this.runtime.writeGeneration(session.id, session.generation)
      else if (await this.compare(session, onDisk, session.generation)) lost.push(session.id)
    }
    return lost
  }

  /**
   * Compares a workspace's marker with the database: no marker (a pool from before markers) is
   * given the recorded number by the caller; a marker ahead is adopted; one behind marks the
   * session failed with the reason and returns the problem.
   */
  private async compare(
    row: Checked,
    onDisk: number | undefined,
    recorded: number,
  ): Promise<CairnProblem | undefined> {
    if (onDisk === undefined || onDisk === recorded) return undefined
    if (onDisk > recorded) {
      await this.store.setGeneration(row.id, onDisk)
      return undefined
    }
    const message = `the workspace of session ${row.id} is at generation ${onDisk} but generation ${recorded} was recorded: it was rolled back or replaced outside Cairn, so the files of the last ${recorded - onDisk} change(s) are gone; restore a snapshot to continue from a known state`
    await this.markLost(row, message)
    return new CairnProblem('state_lost', message, {
      workspaceGeneration: onDisk,
      recordedGeneration: recorded,
    })
  }

  /** Moves the session to `failed` with cause `state_lost` (once), the reason as its detail. */
  private async markLost(row: Checked, message: string): Promise<void> {
    if (!(row.status === 'failed' && row.status_cause === 'state_lost'))
      await this.store.transition(row, 'failed', 'state_lost', this.now(), message)
  }

  /** Writes the next generation's marker and returns the number, for the caller to record. */
  async markNext(sessionId: string): Promise<number> {
    const next = (await this.store.generationOf(sessionId)) + 1
    await this.runtime.writeGeneration(sessionId, next)
    return next
  }

  /** Moves the generation forward: marker, then database. */
  async advance(sessionId: string): Promise<number> {
    const next = await this.markNext(sessionId)
    await whenNotBusy(() => this.store.setGeneration(sessionId, next))
    return next
  }
}
