import {
  AnswerApprovalBody,
  ApprovalListSchema,
  ApprovalParams,
  ApprovalSchema,
  IdParams,
} from '@cairn/protocol'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import type { FastifyInstance } from 'fastify'
import { principalOf, requireWrite } from '../auth/plugin.js'
import { errorResponses } from '../http/responses.js'
import type { ApprovalService } from './approval-service.js'

const errors = errorResponses(400, 401, 404)
const tags = ['approvals']

/**
 * A session's approval requests (docs/approvals.md): any key of the tenant reads them; a write
 * key answers one (a read-only key is refused with `forbidden`).
 */
export function approvalRoutes(server: FastifyInstance, approvals: ApprovalService): void {
  const app = server.withTypeProvider<TypeBoxTypeProvider>()
  app.get(
    '/v1/sessions/:id/approvals',
    {
      schema: {
        tags,
        summary: "The session's approval requests, newest first",
        params: IdParams,
        response: { 200: ApprovalListSchema, ...errors },
      },
    },
    async (request) => ({ data: await approvals.list(principalOf(request).tenantId, request.params.id) }),
  )
  app.get(
    '/v1/sessions/:id/approvals/:approvalId',
    {
      schema: {
        tags,
        summary: 'An approval request and its answer',
        params: ApprovalParams,
        response: { 200: ApprovalSchema, ...errors },
      },
    },
    async (request) =>
      approvals.get(principalOf(request).tenantId, request.params.id, request.params.approvalId),
  )
  app.post(
    '/v1/sessions/:id/approvals/:approvalId/answer',
    {
      schema: {
        tags,
        summary:
          'Approve or deny a pending request (the first answer stands); a turn carries the answer to the agent',
        params: ApprovalParams,
        body: AnswerApprovalBody,
        response: { 200: ApprovalSchema, ...errors, ...errorResponses(403, 409, 410) },
      },
    },
    async (request) =>
      approvals.answer(
        requireWrite(request).tenantId,
        request.params.id,
        request.params.approvalId,
        request.body,
      ),
  )
}
