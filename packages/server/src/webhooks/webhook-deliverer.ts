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
/** Deliveries sent at once by one process: its slots. */
export const WEBHOOK_SEND_SLOTS = 16
/** Of those, the most one tenant's deliveries hold at once, so others always find a slot free. */
export const WEBHOOK_TENANT_SLOTS = 4
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
 *
 * Sending is in slots, shared fairly between tenants: a process sends at most
 * `WEBHOOK_SEND_SLOTS` at once and at most `WEBHOOK_TENANT_SLOTS` of one tenant's, and the slots
 * free are given one at a time, round-robin, to the tenants with deliveries due. A slot that frees
 * is claimed again at once, so one slow receiver holds only its own slot (for at most its
 * attempt's timeout), never a batch, and never another tenant's deliveries.
 */
export class WebhookDeliverer {
  private timer: NodeJS.Timeout | undefined
  private running: Promise<void> | undefined
  private closing = false
  private wantPass = false
  private wantFill = false
  /** The deliveries being sent, and how many of each tenant's. */
  private readonly sending = new Set<Promise<void>>()
  private readonly heldBy = new Map<string, number>()
  /** The tenant last given a slot: the next round starts after it. */
  private lastTenant = ''
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
    this.timer = setInterval(() => this.schedule('pass'), this.pollMs)
    this.timer.unref()
  }

  /** Stops passing; the attempts under way (each bounded by its timeout) are waited for. */
  async close(): Promise<void> {
    this.closing = true
    clearInterval(this.timer)
    await this.running
    await Promise.all(this.sending)
  }

  /** One pass: the outbox into deliveries, the free slots filled, old deliveries purged. */
  async pass(): Promise<void> {
    while ((await this.dispatch()) === OUTBOX_BATCH) {}
    await this.fill()
    const now = this.options.clock.now()
    if (now - this.lastPurgeMs >= PURGE_EVERY_MS) {
      this.lastPurgeMs = now
      await this.purge(now)
    }
  }

  /** Runs a pass, or only a fill (a slot freed), one at a time: what is asked meanwhile runs next. */
  private schedule(work: 'pass' | 'fill'): void {
    if (this.closing) return
    if (work === 'pass') this.wantPass = true
    else this.wantFill = true
    this.running ??= this.work().finally(() => {
      this.running = undefined
      if (this.wantPass || this.wantFill) this.schedule(this.wantPass ? 'pass' : 'fill')
    })
  }

  private async work(): Promise<void> {
    while (!this.closing && (this.wantPass || this.wantFill)) {
      const full = this.wantPass
      this.wantPass = false
      this.wantFill = false
      try {
        await (full ? this.pass() : this.fill())
      } catch (error) {
        this.options.logger.warn({ err: error }, 'webhook pass failed')
      }
    }
  }

  /** Claims deliveries for the free slots, one slot at a time to each tenant in turn, and sends them. */
  private async fill(): Promise<void> {
    const free = WEBHOOK_SEND_SLOTS - this.sending.size
    if (free <= 0) return
    const tenants = await this.dueTenants()
    for (const [tenantId, slots] of this.shares(tenants, free)) {
      for (const delivery of await this.claim(tenantId, slots)) this.send(tenantId, delivery)
      this.lastTenant = tenantId
    }
  }

  /** The free slots shared round-robin, starting after the last tenant served, each up to its cap. */
  private shares(tenants: string[], free: number): Map<string, number> {
    const sorted = [...tenants].sort()
    const start = sorted.findIndex((id) => id > this.lastTenant)
    const order = start <= 0 ? sorted : [...sorted.slice(start), ...sorted.slice(0, start)]
    const shares = new Map<string, number>()
    let left = free
    for (let given = true; left > 0 && given; ) {
      given = false
      for (const id of order) {
        const share = shares.get(id) ?? 0
        if (left === 0 || (this.heldBy.get(id) ?? 0) + share >= WEBHOOK_TENANT_SLOTS) continue
        shares.set(id, share + 1)
        left--
        given = true
      }
    }
    return shares
  }

  /** Sends in a slot of its tenant's; the slot, once free, is claimed again at once. */
  private send(tenantId: string, delivery: Claimed): void {
    this.heldBy.set(tenantId, (this.heldBy.get(tenantId) ?? 0) + 1)
    const sent: Promise<void> = this.deliver(delivery)
      .catch((error: unknown) => this.options.logger.warn({ err: error }, 'webhook delivery failed'))
      .finally(() => {
        this.sending.delete(sent)
        const held = (this.heldBy.get(tenantId) ?? 1) - 1
        if (held > 0) this.heldBy.set(tenantId, held)
        else this.heldBy.delete(tenantId)
        this.schedule('fill')
      })
    this.sending.add(sent)
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

  /** The tenants with deliveries due that no live claim holds (one statement; none when idle). */
  private async dueTenants(): Promise<string[]> {
    const rows = await this.options.db.q
      .selectFrom('webhook_deliveries')
      .select('tenant_id')
      .distinct()
      .where(unclaimed(this.options.clock.now()))
      .where('endpoint_id', 'in', enabledEndpoints)
      .execute()
    return rows.map((r) => r.tenant_id)
  }

  /**
   * Up to `limit` of the tenant's deliveries due that no live claim holds, oldest first, now this
   * process's for `CLAIM_MS`: one statement (on PostgreSQL the rows another process is claiming
   * are skipped, not waited for).
   */
  private async claim(tenantId: string, limit: number): Promise<Claimed[]> {
    const { db } = this.options
    const now = this.options.clock.now()
    // In a CTE, which PostgreSQL runs once (a locking one is never folded into the UPDATE): as
    // an `IN (SELECT … LIMIT)` the subquery may be run again per row, each time skipping other
    // rows, and one claim took 16 rows for a limit of 4.
    const rows = await db.q
      .with('due', (qc) => {
        const due = qc
          .selectFrom('webhook_deliveries')
          .select('id')
          .where(unclaimed(now))
          .where('tenant_id', '=', tenantId)
          .where('endpoint_id', 'in', enabledEndpoints)
          .orderBy('next_attempt_at')
          .limit(limit)
        return db.dialect === 'postgres' ? due.forUpdate().skipLocked() : due
      })
      .updateTable('webhook_deliveries')
      .set({ claimed_until: iso(now + CLAIM_MS) })
      .where('id', 'in', (eb) => eb.selectFrom('due').select('due.id'))
      .where(unclaimed(now))
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

function enabledEndpoints(eb: ExpressionBuilder<Schema, 'webhook_deliveries'>) {
  return eb.selectFrom('webhook_endpoints').select('id').where('enabled', '=', 1)
}

/** A delivery due now that no live claim holds. */
function unclaimed(now: number) {
  return (eb: ExpressionBuilder<Schema, 'webhook_deliveries'>) =>
    eb.and([
      eb('status', '=', 'pending'),
      eb('next_attempt_at', '<=', iso(now)),
      eb.or([eb('claimed_until', 'is', null), eb('claimed_until', '<', iso(now))]),
    ])
}

function parseEvents(json: string): string[] {
  return JSON.parse(json) as string[]
}
