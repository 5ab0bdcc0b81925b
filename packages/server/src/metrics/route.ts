import type { StoragePool, TreeSizes } from '@cairn/runtime'
import type { FastifyInstance } from 'fastify'
import type { Db } from '../db/database.js'
import type { SessionService } from '../sessions/session-service.js'
import { Gauge, type MetricsRegistry } from './registry.js'

/** `GET /metrics` (Prometheus text format, no auth: bind the server to a private address). */
export function installMetrics(
  app: FastifyInstance,
  metrics: MetricsRegistry,
  sessions: SessionService,
  db: Db,
  pool: StoragePool,
): void {
  const byStatus = db.prepare<[], { status: string; n: number }>(
    'SELECT status, COUNT(*) AS n FROM sessions GROUP BY status',
  )
  metrics.add(
    new Gauge('cairn_sessions', 'Sessions by status', () =>
      byStatus.all().map((r) => ({ labels: { status: r.status }, value: r.n })),
    ),
  )
  metrics.add(
    new Gauge('cairn_sandboxes_warm', 'Warm sandboxes (agent process kept between turns)', () => [
      { labels: {}, value: sessions.warmCount },
    ]),
  )
  metrics.add(
    new Gauge('cairn_turns_running', 'Turns running now', () => [
      { labels: {}, value: sessions.runningCount },
    ]),
  )
  metrics.add(
    new Gauge('cairn_process_resident_bytes', 'Resident memory of the server process', () => [
      { labels: {}, value: process.memoryUsage().rss },
    ]),
  )
  // The pool's fill is read on each scrape (a statfs).
  let fill: { total: number; used: number; free: number } | undefined
  let byTenant = new Map<string, TreeSizes>()
  let tenantsReadAt = 0
  const tenants = db.prepare<[], { id: string }>('SELECT id FROM tenants')
  metrics.add(
    new Gauge('cairn_pool_bytes', 'Storage pool filesystem: total, used and free bytes', () =>
      fill
        ? (['total', 'used', 'free'] as const).map((state) => ({
            labels: { state },
            value: fill?.[state] ?? 0,
          }))
        : [],
    ),
  )
  metrics.add(
    new Gauge(
      'cairn_tenant_storage_bytes',
      "What each tenant's trees hold in the pool (exclusive: counted against the tenant quota; referenced: all they hold)",
      () =>
        [...byTenant].flatMap(([tenant, sizes]) => [
          { labels: { tenant, kind: 'exclusive' }, value: sizes.exclusiveBytes },
          { labels: { tenant, kind: 'referenced' }, value: sizes.referencedBytes },
        ]),
    ),
  )
  const quotas = pool.quotaStatus()
  metrics.add(
    new Gauge(
      'cairn_pool_quota_bytes',
      'Storage limits in force (workspace, tenant, reserve, agents_total)',
      () =>
        (
          [
            ['workspace', quotas.workspaceBytes],
            ['tenant', quotas.tenantBytes],
            ['reserve', quotas.reserveBytes],
            ['agents_total', quotas.agentsTotalBytes],
          ] as const
        ).flatMap(([limit, value]) => (value ? [{ labels: { limit }, value }] : [])),
    ),
  )
  app.get('/metrics', { schema: { hide: true } }, async (_request, reply) => {
    const stats = await pool.poolStats().catch(() => undefined)
    fill = stats && { total: stats.totalBytes, used: stats.usedBytes, free: stats.freeBytes }
    // Every tenant's figures come from one listing of all qgroups (O(subvolumes)): at most every 15 s.
    if (Date.now() - tenantsReadAt >= 15_000) {
      tenantsReadAt = Date.now()
      byTenant = await pool.tenantUsage(tenants.all().map((t) => t.id)).catch(() => new Map())
    }
    return reply.type('text/plain; version=0.0.4; charset=utf-8').send(metrics.render())
  })
}
