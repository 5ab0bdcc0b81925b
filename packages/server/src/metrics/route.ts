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
): void {
  const byStatus = db.prepare<[], { status: string; n: number }>(
    'SELECT status, COUNT(*) AS n FROM sessions GROUP BY status',
  )
  metrics.gauge({
    name: 'cairn_sessions',
    help: 'Sessions by status',
    labelNames: ['status'],
    read: () => byStatus.all().map((r) => ({ labels: { status: r.status }, value: r.n })),
  })
  metrics.gauge({
    name: 'cairn_sandboxes_warm',
    help: 'Warm sandboxes (agent process kept between turns)',
    read: () => sessions.warmCount,
  })
  metrics.gauge({ name: 'cairn_turns_running', help: 'Turns running now', read: () => sessions.runningCount })
  metrics.gauge({
    name: 'cairn_process_resident_bytes',
    help: 'Resident memory of the server process',
    read: () => process.memoryUsage().rss,
  })
  app.get('/metrics', { schema: { hide: true } }, async (_request, reply) =>
    reply.type(metrics.contentType).send(await metrics.render()),
  )
}
