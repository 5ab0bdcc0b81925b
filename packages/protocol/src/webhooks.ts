import { type Static, Type } from '@sinclair/typebox'
import { WEBHOOK_DELIVERY_STATUSES, WEBHOOK_EVENT_TYPES } from './names.js'

export const WebhookEventTypeSchema = Type.Union(WEBHOOK_EVENT_TYPES.map((t) => Type.Literal(t)))

/** Most endpoints one tenant may register. */
export const MAX_WEBHOOKS_PER_TENANT = 16
/** Most attempts a delivery gets before it is `failed`. */
export const WEBHOOK_MAX_ATTEMPTS = 8

const UrlSchema = Type.String({ minLength: 1, maxLength: 2048, description: 'http:// or https:// URL' })
const EventsSchema = Type.Array(WebhookEventTypeSchema, { minItems: 1, maxItems: WEBHOOK_EVENT_TYPES.length })
const DescriptionSchema = Type.String({ maxLength: 200 })

export const CreateWebhookBody = Type.Object(
  { url: UrlSchema, events: EventsSchema, description: Type.Optional(DescriptionSchema) },
  { additionalProperties: false },
)
export type CreateWebhookBody = Static<typeof CreateWebhookBody>

export const UpdateWebhookBody = Type.Object(
  {
    url: Type.Optional(UrlSchema),
    events: Type.Optional(EventsSchema),
    description: Type.Optional(Type.Union([DescriptionSchema, Type.Null()])),
    /** A disabled endpoint gets nothing new; what is pending for it waits. */
    enabled: Type.Optional(Type.Boolean()),
  },
  { additionalProperties: false, minProperties: 1 },
)
export type UpdateWebhookBody = Static<typeof UpdateWebhookBody>

/** An endpoint as listed: never its signing secret. */
export const WebhookSchema = Type.Object({
  id: Type.String(),
  url: Type.String(),
  events: Type.Array(WebhookEventTypeSchema),
  description: Type.Union([Type.String(), Type.Null()]),
  enabled: Type.Boolean(),
  createdAt: Type.String(),
  updatedAt: Type.String(),
})
export type Webhook = Static<typeof WebhookSchema>

/** A new endpoint: `secret` (`whsec_…`, Standard Webhooks) is answered this once only. */
export const CreatedWebhookSchema = Type.Composite([WebhookSchema, Type.Object({ secret: Type.String() })])
export type CreatedWebhook = Static<typeof CreatedWebhookSchema>

export const WebhookListSchema = Type.Object({ data: Type.Array(WebhookSchema) })

/** One try of a delivery: the receiver's status code, or why no answer counted. */
export const WebhookAttemptSchema = Type.Object({
  at: Type.String(),
  statusCode: Type.Union([Type.Integer(), Type.Null()]),
  error: Type.Union([Type.String(), Type.Null()]),
  durationMs: Type.Integer(),
})
export type WebhookAttempt = Static<typeof WebhookAttemptSchema>

/** One message to one endpoint and every attempt at it (the delivery log). */
export const WebhookDeliverySchema = Type.Object({
  id: Type.String(),
  webhookId: Type.String(),
  /** The `webhook-id` header: the same on every attempt, so a receiver can drop repeats. */
  messageId: Type.String(),
  eventType: Type.String(),
  status: Type.Union(WEBHOOK_DELIVERY_STATUSES.map((s) => Type.Literal(s))),
  attempts: Type.Array(WebhookAttemptSchema),
  /** When the next attempt is due (pending only). */
  nextAttemptAt: Type.Union([Type.String(), Type.Null()]),
  createdAt: Type.String(),
  endedAt: Type.Union([Type.String(), Type.Null()]),
  /** The body sent, as JSON: `{type, timestamp, data}`. */
  payload: Type.Unknown(),
})
export type WebhookDelivery = Static<typeof WebhookDeliverySchema>

export const WebhookDeliveryListSchema = Type.Object({ data: Type.Array(WebhookDeliverySchema) })

export const WebhookDeliveriesQuery = Type.Object(
  {
    status: Type.Optional(Type.Union(WEBHOOK_DELIVERY_STATUSES.map((s) => Type.Literal(s)))),
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100 })),
  },
  { additionalProperties: false },
)
export type WebhookDeliveriesQuery = Static<typeof WebhookDeliveriesQuery>

/** The body of every webhook request (Standard Webhooks' recommended shape). */
export const WebhookMessageSchema = Type.Object({
  type: WebhookEventTypeSchema,
  timestamp: Type.String(),
  data: Type.Record(Type.String(), Type.Unknown()),
})
export type WebhookMessage = Static<typeof WebhookMessageSchema>
