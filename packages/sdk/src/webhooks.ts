import type {
  WebhookDelivery,
  WebhookDeliveryStatus,
  WebhookEventType,
  Webhook as WebhookInfo,
} from '@cairn/protocol'
import { checked } from './guards.js'
import type { HttpClient, RequestOptions } from './http.js'
import * as valid from './validators.js'

export type { WebhookDelivery, WebhookDeliveryStatus, WebhookEventType, WebhookInfo }

/** A new endpoint: `secret` (`whsec_…`) verifies its deliveries, and is returned this once only. */
export type CreatedWebhook = WebhookInfo & { secret: string }

export interface CreateWebhookOptions extends RequestOptions {
  description?: string | undefined
}

export interface UpdateWebhookOptions extends RequestOptions {
  url?: string | undefined
  events?: WebhookEventType[] | undefined
  /** `null` removes it. */
  description?: string | null | undefined
  enabled?: boolean | undefined
}

export interface ListDeliveriesOptions extends RequestOptions {
  status?: WebhookDeliveryStatus | undefined
  /** 1 to 100 (default 50), newest first. */
  limit?: number | undefined
}

const path = (id = '', rest = '') => `/v1/webhooks${id ? `/${encodeURIComponent(id)}` : ''}${rest}`

/**
 * The tenant's webhook endpoints: lifecycle events sent as signed requests (Standard Webhooks),
 * and each endpoint's delivery log. See docs/webhooks.md.
 */
export class Webhooks {
  constructor(private readonly http: HttpClient) {}

  /** Registers `url` for `events`; the URL must reach an address the server may send to. */
  async create(
    url: string,
    events: WebhookEventType[],
    options: CreateWebhookOptions = {},
  ): Promise<CreatedWebhook> {
    const { description, ...request } = options
    const body = await this.http.json({
      method: 'POST',
      path: path(),
      json: { url, events, description },
      ...request,
    })
    return checked(valid.CreatedWebhook, body, 'new webhook')
  }

  async list(options: RequestOptions = {}): Promise<WebhookInfo[]> {
    const body = await this.http.json({ method: 'GET', path: path(), ...options })
    return checked(valid.WebhookList, body, 'webhook list').data
  }

  async get(id: string, options: RequestOptions = {}): Promise<WebhookInfo> {
    return checked(
      valid.Webhook,
      await this.http.json({ method: 'GET', path: path(id), ...options }),
      'webhook',
    )
  }

  async update(id: string, options: UpdateWebhookOptions): Promise<WebhookInfo> {
    const { url, events, description, enabled, ...request } = options
    const body = await this.http.json({
      method: 'PATCH',
      path: path(id),
      json: { url, events, description, enabled },
      ...request,
    })
    return checked(valid.Webhook, body, 'webhook')
  }

  /** Deletes the endpoint and its delivery log; nothing pending for it is sent. */
  async delete(id: string, options: RequestOptions = {}): Promise<void> {
    await this.http.json({ method: 'DELETE', path: path(id), ...options })
  }

  /** The endpoint's deliveries, newest first, each with every attempt. */
  async deliveries(id: string, options: ListDeliveriesOptions = {}): Promise<WebhookDelivery[]> {
    const { status, limit, ...request } = options
    const body = await this.http.json({
      method: 'GET',
      path: path(id, '/deliveries'),
      query: { status, limit },
      ...request,
    })
    return checked(valid.WebhookDeliveryList, body, 'webhook delivery list').data
  }
}
