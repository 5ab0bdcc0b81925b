import type { RuntimePort } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import type { AgentService } from '../agents/agent-service.js'
import type { Clock } from '../clock.js'
import type { Db } from '../db/database.js'
import type { OperatorLimits } from '../limits/operator-limits.js'
import type { MemoryService } from '../memory/memory-service.js'
import type { MetricsRegistry } from '../metrics/registry.js'
import type { SecretStore } from '../secrets/secret-store.js'
import type { SetupService } from '../setup/setup-service.js'
import type { SessionObserver } from './session-observer.js'

export interface SessionServiceDeps {
  db: Db
  /** The runtime of this replica (its data dir's): the sessions it owns are the ones it acts on. */
  runtimeId: string
  /** The runtime, only through its port. */
  runtime: RuntimePort
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
}
