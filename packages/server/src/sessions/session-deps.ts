import type { RuntimePort } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import type { AgentService } from '../agents/agent-service.js'
import type { Clock } from '../clock.js'
import type { HintFeed } from '../cluster/cluster-hints.js'
import type { Db } from '../db/database.js'
import type { OperatorLimits } from '../limits/operator-limits.js'
import type { StorageBudget } from '../limits/storage-budget.js'
import type { TurnAdmission } from '../limits/turn-admission.js'
import type { MemoryService } from '../memory/memory-service.js'
import type { MetricsRegistry } from '../metrics/registry.js'
import type { SecretStore } from '../secrets/secret-store.js'
import type { SetupService } from '../setup/setup-service.js'
import type { SessionObserver } from './session-observer.js'

/** Where a session made by this replica lives (see `SessionServiceDeps.routing`). */
export interface SessionRouting {
  /** The node the new session's workspace was placed on (its row's `runtime_id`). */
  placedNode(sessionId: string): string | undefined
  /**
   * How long a turn whose node broke its stream waits for the leader's verdict on the node (lost:
   * the turn ends `node_lost`) before it ends `node_unavailable`: the nodes' lease and a check.
   */
  readonly nodeVerdictMs: number
}

/** The separator in a session hold's token taken by an API replica: `<relay ID>/<random>`. */
export const HOLD_TOKEN_SEPARATOR = '/'

/**
 * An API replica's part in turns relayed by several replicas (cluster, `--role api`): each turn
 * names the live process relaying it, and a turn another replica relays can be cancelled here.
 */
export interface TurnRelays {
  /** This process's relay ID (its lease), recorded on each turn it begins. */
  readonly relayId: string
  /**
   * Cancels the session's running turn, which another replica relays: true once it has ended
   * (recorded by its relay, or ended here when the relay is gone), false if none runs.
   */
  cancel(sessionId: string): Promise<boolean>
  /** Calls `listener` for each turn another replica asks this one to cancel. */
  onCancelAsked(listener: (sessionId: string, turnId: string) => void): void
}

export interface SessionServiceDeps {
  db: Db
  /** The runtime of this replica (its data dir's): the sessions it owns are the ones it acts on. */
  runtimeId: string
  /** The runtime, only through its port. */
  runtime: RuntimePort
  /**
   * An API replica's routing (`--role api`): every session is served here whatever its node, and
   * a new one is recorded on the node its workspace was placed on. Unset: sessions are this
   * runtime's (`runtimeId`) and another runtime's are refused with `session_elsewhere`.
   */
  routing?: SessionRouting | undefined
  /** An API replica's relays (with `routing`): turns owned by a live process, cancel from anywhere. */
  relays?: TurnRelays | undefined
  /** Told of sessions' creation, turns and deletion, in this order (see `SessionObserver`). */
  observers?: readonly SessionObserver[] | undefined
  agents: AgentService
  secrets: SecretStore
  /** Extra CA certificates (PEM) the egress proxy trusts upstream when it terminates TLS. */
  egressUpstreamCaPems?: readonly string[] | undefined
  metrics?: MetricsRegistry | undefined
  memory?: MemoryService | undefined
  /** The per-session setup phase (`setup` on creation, `session.setup` in cairn.yaml). */
  setup?: SetupService | undefined
  /** The operator's maxima: sandbox limits, setup timeouts, sandboxes per tenant. */
  operatorLimits: OperatorLimits
  clock: Clock
  logger: Logger
  /**
   * The cluster's hints (PostgreSQL): a replica streaming a turn to a resumed client hears that
   * its events were written. Without them it reads at `turnEventsPollMs`.
   */
  hints?: HintFeed | undefined
  /** How long a running turn's events wait before they are written (default 250 ms). */
  turnEventsFlushMs?: number | undefined
  /** The tenant storage budget a running turn's event batches are reserved in before they are written. */
  storageBudget?: StorageBudget | undefined
  /**
   * Admits a turn's prompt and end in the tenant storage budget before any sandbox work (made and
   * closed by the composition root, which releases its reservations when the server stops).
   */
  turnAdmission?: TurnAdmission | undefined
  /** How often a resumed stream of a turn running elsewhere reads its new events (default 500 ms). */
  turnEventsPollMs?: number | undefined
}
