import { CairnProblem } from '@cairn/protocol'
import type { RuntimePort } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import type { Db } from '../db/database.js'
import type { TurnRelays } from '../sessions/session-deps.js'
import type { HintFeed } from './cluster-hints.js'
import {
  type EndedTurn,
  endRelayedTurns,
  pruneReplicas,
  releaseDeadRelayHolds,
  runningRelayedTurn,
} from './relayed-turns.js'
import type { ReplicaLease } from './replica-lease.js'

/** How often a cancel of a turn another replica relays looks whether it has ended. */
const CANCEL_POLL_MS = 100
/** Past the relay's lease, how long such a cancel waits for the turn's end before answering 503. */
const CANCEL_SLACK_MS = 5000
/** How long the rows of replica processes that ended are kept (what a turn's `relay_id` names). */
const KEEP_ENDED_REPLICAS_MS = 24 * 3600 * 1000

/**
 * The turns API replicas relay (cluster, `--role api`): this process's lease names each turn it
 * begins; a turn whose relay is gone is ended `replica_lost` (by the leader's pass, or by a cancel
 * through any replica) and its node told to stop the agent; a cancel reaching a replica that does
 * not relay the turn asks the one that does (a hint).
 */
export class ReplicaTurns implements TurnRelays {
  constructor(
    private readonly deps: {
      db: Db
      lease: ReplicaLease
      hints: HintFeed
      runtime: RuntimePort
      logger: Logger
    },
  ) {}

  get relayId(): string {
    return this.deps.lease.id
  }

  /**
   * The replica relaying the turn is asked (a hint) and its node told directly; the answer comes
   * once the turn row has ended: recorded `cancelled` by a live relay, or, a relay being gone,
   * ended `replica_lost` here once its lease is over. `503 unavailable` if a live relay has not
   * recorded the end within its lease and `CANCEL_SLACK_MS`.
   */
  async cancel(sessionId: string): Promise<boolean> {
    const { db } = this.deps
    const running = await runningRelayedTurn(db, sessionId)
    if (!running) return false
    const { turnId } = running
    if (running.relayLive) {
      await this.deps.hints.publish({ kind: 'turn.cancel', sessionId, turnId })
      this.stopAgents([{ sessionId, turnId, relayId: running.relayId ?? '' }])
    }
    const deadline = performance.now() + this.deps.lease.leaseMs + CANCEL_SLACK_MS
    for (;;) {
      const now = await runningRelayedTurn(db, sessionId)
      if (now?.turnId !== turnId) return true
      if (!now.relayLive && (await this.endLost(turnId)) > 0) return true
      if (performance.now() > deadline)
        throw new CairnProblem(
          'unavailable',
          `turn ${turnId} was asked to stop but has not ended yet (the replica relaying it has not recorded it); retry`,
          { turnId },
        )
      await new Promise((resolve) => setTimeout(resolve, CANCEL_POLL_MS))
    }
  }

  /** Ends the turn `replica_lost` if its relay's lease is over (its node told); how many it ended. */
  private async endLost(turnId: string): Promise<number> {
    const ended = await endRelayedTurns(
      this.deps.db,
      { deadRelays: true, turnId },
      { code: 'replica_lost', reason: 'its lease ended' },
    )
    this.report(ended, 'a cancel ended the turn of a lost API replica')
    return ended.length
  }

  onCancelAsked(listener: (sessionId: string, turnId: string) => void): void {
    this.deps.hints
      .subscribe((hint) => {
        if (hint.kind === 'turn.cancel') listener(hint.sessionId, hint.turnId)
      })
      .catch((error: unknown) =>
        this.deps.logger.warn({ err: error }, 'listening for cancels through other replicas failed'),
      )
  }

  /** Takes this process's lease, ending its predecessors' turns (a restart in the same data dir). */
  async start(): Promise<void> {
    this.report(await this.deps.lease.start(), 'turns a killed process of this replica left ended')
  }

  /**
   * The leader's pass: ends the turns of every replica process whose lease is over, and releases
   * the session holds they took.
   */
  async failLostRelays(): Promise<EndedTurn[]> {
    const ended = await endRelayedTurns(
      this.deps.db,
      { deadRelays: true },
      { code: 'replica_lost', reason: 'its lease ended' },
    )
    this.report(ended, 'turns of lost API replicas ended')
    const released = await releaseDeadRelayHolds(this.deps.db)
    if (released > 0)
      this.deps.logger.warn({ sessions: released }, 'session holds of lost API replicas released')
    await pruneReplicas(this.deps.db, KEEP_ENDED_REPLICAS_MS)
    return ended
  }

  private report(ended: EndedTurn[], what: string): void {
    if (ended.length === 0) return
    this.deps.logger.warn(
      { turns: ended.map((t) => `${t.sessionId}/${t.turnId} (${t.relayId})`) },
      `${what} (replica_lost)`,
    )
    this.stopAgents(ended)
  }

  /** Tells each turn's node to stop it (its relay is gone: nobody else will). */
  private stopAgents(ended: EndedTurn[]): void {
    for (const { sessionId, turnId } of ended)
      void this.deps.runtime
        .cancelTurn(sessionId, turnId)
        .catch((error: unknown) =>
          this.deps.logger.warn(
            { err: error, session: sessionId, turn: turnId },
            "telling a lost replica's turn's node to stop it failed",
          ),
        )
  }
}
