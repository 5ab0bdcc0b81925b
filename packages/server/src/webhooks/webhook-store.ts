import { createHmac } from 'node:crypto'
import {
  CairnProblem,
  type CreatedWebhook,
  type CreateWebhookBody,
  MAX_WEBHOOKS_PER_TENANT,
  newId,
  type UpdateWebhookBody,
  type Webhook,
  type WebhookAttempt,
  type WebhookDeliveriesQuery,
  type WebhookDelivery,
  type WebhookDeliveryStatus,
  type WebhookEventType,
} from '@cairn/protocol'
import type { Selectable } from 'kysely'
import { type Clock, iso } from '../clock.js'
import type { Db } from '../db/database.js'
import type { Schema } from '../db/schema.js'
import type { WebhookAddressGuard } from './webhook-address.js'

type EndpointRow = Selectable<Schema['webhook_endpoints']>
type DeliveryRow = Selectable<Schema['webhook_deliveries']>

/**
 * A tenant's webhook endpoints and their delivery logs. An endpoint's signing secret is never
 * stored: it is derived from the install's key and the endpoint's ID (`secretOf`), answered once
 * when the endpoint is made, and derived again for each delivery.
 */
export class WebhookStore {
  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    private readonly guard: WebhookAddressGuard,
    /** The key webhook secrets are derived from (the secrets key's, for this purpose). */
    private readonly signingKey: Buffer,
  ) {}

  /** `whsec_` and 32 bytes in base64: the Standard Webhooks form of a signing secret. */
  secretOf(endpointId: string): string {
    return `whsec_${createHmac('sha256', this.signingKey).update(endpointId).digest('base64')}`
  }

  async create(tenantId: string, body: CreateWebhookBody): Promise<CreatedWebhook> {
    const url = await this.guard.check(body.url)
    const at = iso(this.clock.now())
    const row: EndpointRow = {
      id: newId('webhook'),
      tenant_id: tenantId,
      url: url.href,
      events_json: JSON.stringify(unique(body.events)),
      description: body.description ?? null,
      enabled: 1,
      created_at: at,
      updated_at: at,
    }
    await this.db.transaction(async () => {
      // Concurrent creates of one tenant count one after the other.
      if (this.db.dialect === 'postgres')
        await this.db.q.selectFrom('tenants').select('id').where('id', '=', tenantId).forUpdate().execute()
      const held = await this.db.q
        .selectFrom('webhook_endpoints')
        .select((eb) => eb.fn.countAll<number>().as('n'))
        .where('tenant_id', '=', tenantId)
        .executeTakeFirstOrThrow()
      if (Number(held.n) >= MAX_WEBHOOKS_PER_TENANT)
        throw new CairnProblem(
          'webhook_limit_reached',
          `this tenant already has ${held.n} webhook endpoints, the most it may (${MAX_WEBHOOKS_PER_TENANT}): delete one first`,
          { maxWebhooks: MAX_WEBHOOKS_PER_TENANT },
        )
      await this.db.q.insertInto('webhook_endpoints').values(row).execute()
    })
    return { ...toWebhook(row), secret: this.secretOf(row.id) }
  }

  async list(tenantId: string): Promise<Webhook[]> {
    const rows = await this.db.q
      .selectFrom('webhook_endpoints')
      .selectAll()
      .where('tenant_id', '=', tenantId)
      .orderBy('created_at')
      .orderBy('id')
      .execute()
    return rows.map(toWebhook)
  }

  async get(tenantId: string, id: string): Promise<Webhook> {
    return toWebhook(await this.row(tenantId, id))
  }

  async update(tenantId: string, id: string, body: UpdateWebhookBody): Promise<Webhook> {
    await this.row(tenantId, id)
    const url = body.url === undefined ? undefined : (await this.guard.check(body.url)).href
    await this.db.q
      .updateTable('webhook_endpoints')
      .set({
        ...(url === undefined ? {} : { url }),
        ...(body.events === undefined ? {} : { events_json: JSON.stringify(unique(body.events)) }),
        ...(body.description === undefined ? {} : { description: body.description }),
        ...(body.enabled === undefined ? {} : { enabled: body.enabled ? 1 : 0 }),
        updated_at: iso(this.clock.now()),
      })
      .where('id', '=', id)
      .where('tenant_id', '=', tenantId)
      .execute()
    return this.get(tenantId, id)
  }

  /** Deletes the endpoint and its delivery log; what was pending for it is not sent. */
  async delete(tenantId: string, id: string): Promise<void> {
    await this.row(tenantId, id)
    await this.db.transaction(async () => {
      await this.db.q.deleteFrom('webhook_deliveries').where('endpoint_id', '=', id).execute()
      await this.db.q
        .deleteFrom('webhook_endpoints')
        .where('id', '=', id)
        .where('tenant_id', '=', tenantId)
        .execute()
    })
  }

  /** The endpoint's deliveries, newest first. */
  async deliveries(tenantId: string, id: string, query: WebhookDeliveriesQuery): Promise<WebhookDelivery[]> {
    await this.row(tenantId, id)
    let select = this.db.q
      .selectFrom('webhook_deliveries')
      .selectAll()
      .where('endpoint_id', '=', id)
      .where('tenant_id', '=', tenantId)
    if (query.status) select = select.where('status', '=', query.status)
    const rows = await select
      .orderBy('created_at', 'desc')
      .orderBy('id', 'desc')
      .limit(query.limit ?? 50)
      .execute()
    return rows.map(toDelivery)
  }

  private async row(tenantId: string, id: string): Promise<EndpointRow> {
    const row = await this.db.q
      .selectFrom('webhook_endpoints')
      .selectAll()
      .where('id', '=', id)
      .where('tenant_id', '=', tenantId)
      .executeTakeFirst()
    if (!row) throw new CairnProblem('webhook_not_found', `No webhook endpoint found matching '${id}'`)
    return row
  }
}

function unique(events: readonly WebhookEventType[]): WebhookEventType[] {
  return [...new Set(events)]
}

function toWebhook(row: EndpointRow): Webhook {
  return {
    id: row.id,
    url: row.url,
    events: JSON.parse(row.events_json) as WebhookEventType[],
    description: row.description,
    enabled: Number(row.enabled) === 1,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
  }
}

function toDelivery(row: DeliveryRow): WebhookDelivery {
  return {
    id: row.id,
    webhookId: row.endpoint_id,
    messageId: row.message_id,
    eventType: row.event_type,
    status: row.status as WebhookDeliveryStatus,
    attempts: JSON.parse(row.attempts_json) as WebhookAttempt[],
    nextAttemptAt: row.status === 'pending' ? row.next_attempt_at : null,
    createdAt: row.created_at,
    endedAt: row.ended_at,
    payload: JSON.parse(row.payload) as unknown,
  }
}
