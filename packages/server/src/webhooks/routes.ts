import {
  CreatedWebhookSchema,
  CreateWebhookBody,
  IdParams,
  OkSchema,
  UpdateWebhookBody,
  WebhookDeliveriesQuery,
  WebhookDeliveryListSchema,
  WebhookListSchema,
  WebhookSchema,
} from '@cairn/protocol'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import type { FastifyInstance } from 'fastify'
import { principalOf, requireWrite } from '../auth/plugin.js'
import { errorResponses } from '../http/responses.js'
import type { WebhookStore } from './webhook-store.js'

const errors = errorResponses(400, 401, 403, 404)
const tags = ['webhooks']

/**
 * A tenant's webhook endpoints (docs/webhooks.md): a write key registers, changes and deletes
 * them; any key reads them and their delivery logs. The signing secret is answered on create only.
 */
export function webhookRoutes(server: FastifyInstance, webhooks: WebhookStore): void {
  const app = server.withTypeProvider<TypeBoxTypeProvider>()
  app.post(
    '/v1/webhooks',
    {
      schema: {
        tags,
        summary: 'Register a webhook endpoint (its signing secret is answered this once)',
        body: CreateWebhookBody,
        response: { 201: CreatedWebhookSchema, ...errors, ...errorResponses(409, 422) },
      },
    },
    async (request, reply) =>
      reply.status(201).send(await webhooks.create(requireWrite(request).tenantId, request.body)),
  )
  app.get(
    '/v1/webhooks',
    {
      schema: {
        tags,
        summary: "The tenant's webhook endpoints",
        response: { 200: WebhookListSchema, ...errors },
      },
    },
    async (request) => ({ data: await webhooks.list(principalOf(request).tenantId) }),
  )
  app.get(
    '/v1/webhooks/:id',
    {
      schema: {
        tags,
        summary: 'A webhook endpoint',
        params: IdParams,
        response: { 200: WebhookSchema, ...errors },
      },
    },
    async (request) => webhooks.get(principalOf(request).tenantId, request.params.id),
  )
  app.patch(
    '/v1/webhooks/:id',
    {
      schema: {
        tags,
        summary: "Change a webhook endpoint's URL, events, description or whether it is enabled",
        params: IdParams,
        body: UpdateWebhookBody,
        response: { 200: WebhookSchema, ...errors, ...errorResponses(422) },
      },
    },
    async (request) => webhooks.update(requireWrite(request).tenantId, request.params.id, request.body),
  )
  app.delete(
    '/v1/webhooks/:id',
    {
      schema: {
        tags,
        summary: 'Delete a webhook endpoint and its delivery log',
        params: IdParams,
        response: { 200: OkSchema, ...errors },
      },
    },
    async (request) => {
      await webhooks.delete(requireWrite(request).tenantId, request.params.id)
      return { ok: true }
    },
  )
  app.get(
    '/v1/webhooks/:id/deliveries',
    {
      schema: {
        tags,
        summary: "A webhook endpoint's deliveries, newest first, each with its attempts (the delivery log)",
        params: IdParams,
        querystring: WebhookDeliveriesQuery,
        response: { 200: WebhookDeliveryListSchema, ...errors },
      },
    },
    async (request) => ({
      data: await webhooks.deliveries(principalOf(request).tenantId, request.params.id, request.query),
    }),
  )
}
