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
  app.get('/metrics', { schema: { hide: true } }, async (_request, reply) =>
    reply.type('text/plain; version=0.0.4; charset=utf-8').send(metrics.render()),
  )
}
