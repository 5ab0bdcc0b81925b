import type { PoolQuotaStatus, RuntimePort, TreeSizes } from '@cairn/runtime/port'
import type { FastifyInstance } from 'fastify'
import type { Db } from '../db/database.js'
import type { SessionService } from '../sessions/session-service.js'
import type { MetricsRegistry } from './registry.js'

/** `GET /metrics` (Prometheus text format, no auth: bind the server to a private address). */
export function installMetrics(
  app: FastifyInstance,
  metrics: MetricsRegistry,
  sessions: SessionService,
  db: Db,
  pool: Pick<RuntimePort, 'quotaStatus' | 'poolStats' | 'tenantUsage'>,
  /** Reads other figures before each scrape (a cluster's nodes). */
  beforeScrape?: () => Promise<void>,
): void {
  // Gauges are read synchronously at render: the figures from the database are read before.
  let byStatus: { status: string; n: number }[] = []
  metrics.gauge({
    name: 'cairn_sessions',
    help: 'Sessions by status',
    labelNames: ['status'],
    read: () => byStatus.map((r) => ({ labels: { status: r.status }, value: r.n })),
  })
  let warm = 0
  metrics.gauge({
    name: 'cairn_sandboxes_warm',
    help: 'Warm sandboxes (agent process kept between turns)',
    read: () => warm,
  })
  metrics.gauge({ name: 'cairn_turns_running', help: 'Turns running now', read: () => sessions.runningCount })
  metrics.gauge({
    name: 'cairn_process_resident_bytes',
    help: 'Resident memory of the server process',
    read: () => process.memoryUsage().rss,
  })
  // The pool's fill is read on each scrape (a statfs).
  let fill: { total: number; used: number; free: number } | undefined
  let byTenant = new Map<string, TreeSizes>()
  let tenantsReadAt = 0
  metrics.gauge({
    name: 'cairn_pool_bytes',
    help: 'Storage pool filesystem: total, used and free bytes',
    labelNames: ['state'],
    read: () =>
      fill
        ? (['total', 'used', 'free'] as const).map((state) => ({
            labels: { state },
            value: fill?.[state] ?? 0,
          }))
        : [],
  })
  metrics.gauge({
    name: 'cairn_tenant_storage_bytes',
    help: "What each tenant's trees hold in the pool (exclusive: counted against the tenant quota; referenced: all they hold)",
    labelNames: ['tenant', 'kind'],
    read: () =>
      [...byTenant].flatMap(([tenant, sizes]) => [
        { labels: { tenant, kind: 'exclusive' }, value: sizes.exclusiveBytes },
        { labels: { tenant, kind: 'referenced' }, value: sizes.referencedBytes },
      ]),
  })
  let quotas: Partial<PoolQuotaStatus> = {}
  metrics.gauge({
    name: 'cairn_pool_quota_bytes',
    help: 'Storage limits in force (workspace, tenant, reserve, agents_total, images)',
    labelNames: ['limit'],
    read: () =>
      (
        [
          ['workspace', quotas.workspaceBytes],
          ['tenant', quotas.tenantBytes],
          ['reserve', quotas.reserveBytes],
          ['agents_total', quotas.agentsTotalBytes],
          ['images', quotas.imagesBytes],
        ] as const
      ).flatMap(([limit, value]) => (value ? [{ labels: { limit }, value }] : [])),
  })
  app.get('/metrics', { schema: { hide: true } }, async (_request, reply) => {
    // Without the pool's figures the scrape still answers; the pool gauges are then left out.
    byStatus = (
      await db.q
        .selectFrom('sessions')
        .select((eb) => ['status', eb.fn.countAll<number>().as('n')])
        .groupBy('status')
        .execute()
    ).map((r) => ({ status: r.status, n: Number(r.n) }))
    warm = await sessions.warmCount().catch(() => warm)
    quotas = await pool.quotaStatus().catch(() => quotas)
    const stats = await pool.poolStats().catch(() => undefined)
    fill = stats && { total: stats.totalBytes, used: stats.usedBytes, free: stats.freeBytes }
    // Every tenant's figures come from one listing of all qgroups (O(subvolumes)): at most every 15 s.
    if (Date.now() - tenantsReadAt >= 15_000) {
      tenantsReadAt = Date.now()
      const tenants = await db.q.selectFrom('tenants').select('id').execute()
      byTenant = new Map(Object.entries(await pool.tenantUsage(tenants.map((t) => t.id)).catch(() => ({}))))
    }
    await beforeScrape?.()
    return reply.type(metrics.contentType).send(await metrics.render())
  })
}
