import { newId, WEBHOOK_MAX_ATTEMPTS, type WebhookAttempt } from '@cairn/protocol'
import type { ExpressionBuilder } from 'kysely'
import type { Logger } from 'pino'
import { type Clock, iso } from '../clock.js'
import type { Db } from '../db/database.js'
import type { Schema } from '../db/schema.js'
import { messagesOf, type OutboxEvent, retryDelayMs } from './webhook-events.js'
import type { AttemptOutcome, WebhookRequest, WebhookSender } from './webhook-sender.js'

export interface WebhookDelivererOptions {
  db: Db
  clock: Clock
  logger: Logger
  sender: Pick<WebhookSender, 'send'>
  secretOf: (endpointId: string) => string
  /** How often the outbox and the due deliveries are looked at (default 1 s). */
  pollMs?: number | undefined
  /** The first retry's wait; each next one is 4 times longer (default 5 s, at most 6 h). */
  retryBaseMs?: number | undefined
  /** How long ended deliveries stay in the log (default 7 days). */
  retentionMs?: number | undefined
}

/** Outbox rows turned into deliveries per pass. */
const OUTBOX_BATCH = 100
/** Deliveries sent at once by one process. */
const SEND_BATCH = 8
/** How long a claimed delivery is this process's: longer than an attempt may take. */
const CLAIM_MS = 60_000
const PURGE_EVERY_MS = 60_000

interface Claimed {
  id: string
  endpoint_id: string
  url: string
  message_id: string
  payload: string
  attempts_json: string
}

/**
 * Sends what the outbox holds: each pass turns outbox rows into one delivery per message and
 * subscribed endpoint (in one transaction, the rows deleted with it), then claims the deliveries
 * due and sends them. A claim (`claimed_until`) makes a delivery one process's while it is sent,
 * so with several replicas each is sent by one; a process that dies lets its claims lapse, and
 * another sends them (at least once: a receiver drops repeats by `webhook-id`). An attempt that
 * fails is retried with exponential backoff; after `WEBHOOK_MAX_ATTEMPTS` the delivery is `failed`.
 */
export class WebhookDeliverer {
  private timer: NodeJS.Timeout | undefined
  private running: Promise<void> | undefined
  private lastPurgeMs = 0
  private readonly pollMs: number
  private readonly retryBaseMs: number
  private readonly retentionMs: number

  constructor(private readonly options: WebhookDelivererOptions) {
    this.pollMs = options.pollMs ?? 1000
    this.retryBaseMs = options.retryBaseMs ?? 5000
    this.retentionMs = options.retentionMs ?? 7 * 24 * 3600 * 1000
  }

  start(): void {
    this.timer = setInterval(() => {
      this.running ??= this.pass()
        .catch((error: unknown) => this.options.logger.warn({ err: error }, 'webhook pass failed'))
        .finally(() => {
          this.running = undefined
        })
    }, this.pollMs)
    this.timer.unref()
  }

  /** Stops passing; a pass under way (its attempts bounded by their timeout) is waited for. */
  async close(): Promise<void> {
    clearInterval(this.timer)
    await this.running
  }

  /** One pass: the outbox into deliveries, the due deliveries sent, old ones purged. */
  async pass(): Promise<void> {
    while ((await this.dispatch()) === OUTBOX_BATCH) {}
    const claimed = await this.claim()
    await Promise.all(claimed.map((delivery) => this.deliver(delivery)))
    const now = this.options.clock.now()
    if (now - this.lastPurgeMs >= PURGE_EVERY_MS) {
      this.lastPurgeMs = now
      await this.purge(now)
    }
  }

  /** Turns up to a batch of outbox rows into deliveries; answers how many rows it took. */
  private async dispatch(): Promise<number> {
    const { db } = this.options
    // One statement, and no transaction, when there is nothing (the usual case).
    if (!(await db.q.selectFrom('webhook_outbox').select('seq').limit(1).executeTakeFirst())) return 0
    return db.transaction(async () => {
      let select = db.q.selectFrom('webhook_outbox').selectAll().orderBy('seq').limit(OUTBOX_BATCH)
      if (db.dialect === 'postgres') select = select.forUpdate().skipLocked()
      const rows = await select.execute()
      if (rows.length === 0) return 0
      const deliveries = await this.deliveriesFor(rows)
      for (let i = 0; i < deliveries.length; i += OUTBOX_BATCH)
        await db.q
          .insertInto('webhook_deliveries')
          .values(deliveries.slice(i, i + OUTBOX_BATCH))
          .execute()
      await db.q
        .deleteFrom('webhook_outbox')
        .where(
          'seq',
          'in',
          rows.map((r) => r.seq),
        )
        .execute()
      return rows.length
    })
  }

  /** One delivery per message of each row and enabled endpoint of its tenant subscribed to it. */
  private async deliveriesFor(rows: (OutboxEvent & { tenant_id: string })[]) {
    const endpoints = await this.options.db.q
      .selectFrom('webhook_endpoints')
      .select(['id', 'tenant_id', 'events_json'])
      .where('tenant_id', 'in', [...new Set(rows.map((r) => r.tenant_id))])
      .where('enabled', '=', 1)
      .execute()
    const created = iso(this.options.clock.now())
    return rows.flatMap((row) =>
      messagesOf(row).flatMap((message) => {
        const messageId = newId('webhookMessage')
        return endpoints
          .filter((e) => e.tenant_id === row.tenant_id && parseEvents(e.events_json).includes(message.type))
          .map((e) => ({
            id: newId('webhookDelivery'),
            endpoint_id: e.id,
            tenant_id: row.tenant_id,
            message_id: messageId,
            event_type: message.type,
            payload: JSON.stringify(message),
            status: 'pending',
            next_attempt_at: created,
            created_at: created,
          }))
      }),
    )
  }

  /**
   * The deliveries due that no live claim holds, now this process's for `CLAIM_MS`: one
   * statement (on PostgreSQL the rows another process is claiming are skipped, not waited for).
   */
  private async claim(): Promise<Claimed[]> {
    const { db } = this.options
    const now = this.options.clock.now()
    const unclaimed = (eb: ExpressionBuilder<Schema, 'webhook_deliveries'>) =>
      eb.and([
        eb('status', '=', 'pending'),
        eb('next_attempt_at', '<=', iso(now)),
        eb.or([eb('claimed_until', 'is', null), eb('claimed_until', '<', iso(now))]),
      ])
    let due = db.q
      .selectFrom('webhook_deliveries')
      .select('id')
      .where(unclaimed)
      .where('endpoint_id', 'in', (eb) =>
        eb.selectFrom('webhook_endpoints').select('id').where('enabled', '=', 1),
      )
      .orderBy('next_attempt_at')
      .limit(SEND_BATCH)
    if (db.dialect === 'postgres') due = due.forUpdate().skipLocked()
    const rows = await db.q
      .updateTable('webhook_deliveries')
      .set({ claimed_until: iso(now + CLAIM_MS) })
      .where('id', 'in', due)
      .where(unclaimed)
      .returning(['id', 'endpoint_id', 'message_id', 'payload', 'attempts_json'])
      .execute()
    if (rows.length === 0) return []
    const urls = new Map(
      (
        await db.q
          .selectFrom('webhook_endpoints')
          .select(['id', 'url'])
          .where(
            'id',
            'in',
            rows.map((r) => r.endpoint_id),
          )
          .execute()
      ).map((e) => [e.id, e.url]),
    )
    return rows.flatMap((r) => {
      const url = urls.get(r.endpoint_id)
      return url ? [{ ...r, url }] : []
    })
  }

  private async deliver(delivery: Claimed): Promise<void> {
    const { clock, db } = this.options
    const at = clock.now()
    const request: WebhookRequest = {
      url: delivery.url,
      secret: this.options.secretOf(delivery.endpoint_id),
      messageId: delivery.message_id,
      payload: delivery.payload,
      at: new Date(at),
    }
    const outcome: AttemptOutcome = await this.options.sender.send(request)
    const attempts = [
      ...(JSON.parse(delivery.attempts_json) as WebhookAttempt[]),
      { at: iso(at), statusCode: outcome.statusCode, error: outcome.error, durationMs: outcome.durationMs },
    ]
    const ended = outcome.ok || attempts.length >= WEBHOOK_MAX_ATTEMPTS
    const endedAt = iso(clock.now())
    await db.q
      .updateTable('webhook_deliveries')
      .set({
        attempts_json: JSON.stringify(attempts),
        status: outcome.ok ? 'delivered' : ended ? 'failed' : 'pending',
        next_attempt_at: ended ? null : iso(clock.now() + retryDelayMs(attempts.length, this.retryBaseMs)),
        claimed_until: null,
        ended_at: ended ? endedAt : null,
      })
      .where('id', '=', delivery.id)
      .where('status', '=', 'pending')
      .execute()
    if (!outcome.ok)
      this.options.logger.info(
        { delivery: delivery.id, attempt: attempts.length, error: outcome.error, ended },
        'webhook attempt failed',
      )
  }

  /** Ended deliveries older than the retention leave the log. */
  private async purge(now: number): Promise<void> {
    await this.options.db.q
      .deleteFrom('webhook_deliveries')
      .where('ended_at', 'is not', null)
      .where('ended_at', '<', iso(now - this.retentionMs))
      .execute()
  }
}

function parseEvents(json: string): string[] {
  return JSON.parse(json) as string[]
}
