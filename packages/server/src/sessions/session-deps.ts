import type { Runtime } from '@cairn/runtime'
import type { Logger } from 'pino'
import type { AgentService } from '../agents/agent-service.js'
import type { Clock } from '../clock.js'
import type { Db } from '../db/database.js'
import type { MemoryService } from '../memory/memory-service.js'
import type { MetricsRegistry } from '../metrics/registry.js'
import type { SecretStore } from '../secrets/secret-store.js'
import type { SetupService } from '../setup/setup-service.js'

export interface SessionServiceDeps {
  db: Db
  runtime: Runtime
  agents: AgentService
  secrets: SecretStore
  /** Private addresses the operator lets sandboxes reach through the egress proxy. */
  egressPrivateExceptions?: ReadonlySet<string> | undefined
  /** Names the egress proxy resolves before DNS (the operator's `CAIRN_EGRESS_HOSTS`). */
  egressHosts?: ReadonlyMap<string, readonly string[]> | undefined
  /** Extra CA certificates (PEM) the egress proxy trusts upstream when it terminates TLS. */
  egressUpstreamCaPems?: readonly string[] | undefined
  metrics?: MetricsRegistry | undefined
  memory?: MemoryService | undefined
  /** The per-session setup phase (`setup` on creation, `session.setup` in cairn.yaml). */
  setup?: SetupService | undefined
  clock: Clock
  logger: Logger
}
