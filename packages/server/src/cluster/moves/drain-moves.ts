import type { Logger } from 'pino'
import type { Db } from '../../db/database.js'
import type { SessionMover } from './session-mover.js'

/**
 * The leader's pass that empties draining nodes: each of their sessions with no running turn is
 * moved (`SessionMover`, placement picks the target) until none is left; a session with a turn
 * is moved once its turn ends (a later pass). The pass starts a round in the background and
 * returns (the leader's node checks are not held up by a long drain); a round runs `parallel`
 * moves at once, and a new round starts only when the last one ended.
 */
export class DrainMoves {
  private round: Promise<void> | undefined
  private stopped = false
  /** Moves that failed, by session: retried on later rounds (logged once each). */
  private readonly failed = new Set<string>()

  constructor(private readonly deps: { db: Db; mover: SessionMover; logger: Logger; parallel?: number }) {}

  /**
   * Starts a round unless one runs; resolves at once. A round that fails (PostgreSQL down) is
   * logged and the next pass tries again: nobody awaits it, so its rejection crashed the replica.
   */
  async pass(): Promise<void> {
    if (this.round || this.stopped) return
    this.round = this.runRound()
      .catch((error: unknown) =>
        this.deps.logger.warn({ err: error }, 'a round of drain moves failed; the next pass tries again'),
      )
      .finally(() => {
        this.round = undefined
      })
  }

  /** No new round, and the running one takes no further session (shutdown). */
  stop(): void {
    this.stopped = true
  }

  /** Waits for the running round, if any (shutdown). */
  async settle(): Promise<void> {
    await this.round?.catch(() => undefined)
  }

  /** The sessions of draining nodes that no turn runs in now. */
  async pending(): Promise<string[]> {
    const rows = await this.deps.db.q
      .selectFrom('sessions as s')
      .innerJoin('nodes as n', 'n.id', 's.runtime_id')
      .select('s.id')
      .where('n.state', '=', 'draining')
      .where('s.status', '!=', 'deleted')
      .where((eb) =>
        eb.not(
          eb.exists(
            eb
              .selectFrom('turns as t')
              .select('t.id')
              .whereRef('t.session_id', '=', 's.id')
              .where('t.status', '=', 'running'),
          ),
        ),
      )
      .orderBy('s.id')
      .execute()
    return rows.map((row) => row.id)
  }

  private async runRound(): Promise<void> {
    const queue = await this.pending()
    const worker = async () => {
      for (let id = queue.shift(); id !== undefined && !this.stopped; id = queue.shift()) {
        try {
          const moved = await this.deps.mover.moveById(id)
          this.failed.delete(id)
          this.deps.logger.info(
            { session: id, from: moved.fromNode, to: moved.toNode, durationMs: moved.durationMs },
            'drain moved a session',
          )
        } catch (error) {
          if (!this.failed.has(id))
            this.deps.logger.warn({ err: error, session: id }, 'drain could not move a session (retried)')
          this.failed.add(id)
        }
      }
    }
    await Promise.all(Array.from({ length: this.deps.parallel ?? 4 }, worker))
  }
}
