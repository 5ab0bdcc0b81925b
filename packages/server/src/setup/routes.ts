import { IdParams, ResumeInfoSchema, SetupInfoSchema } from '@cairn/protocol'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import type { FastifyInstance } from 'fastify'
import { principalOf } from '../auth/plugin.js'
import { bytesResponse, errorResponses } from '../http/responses.js'
import type { SessionService } from '../sessions/session-service.js'
import type { SetupService } from './setup-service.js'

const errors = errorResponses(401, 404, 410)
const idOf = (request: { params: { id: string } }) => request.params.id

export function setupRoutes(server: FastifyInstance, setup: SetupService, sessions: SessionService): void {
  const app = server.withTypeProvider<TypeBoxTypeProvider>()
  app.get(
    '/v1/sessions/:id/setup',
    {
      schema: {
        tags: ['sessions'],
        summary: "The session's setup phase: command, status, attempts, exit code, snapshot, log tail",
        params: IdParams,
        response: { 200: SetupInfoSchema, ...errors },
      },
    },
    async (request) => setup.info((await sessions.require(principalOf(request).tenantId, idOf(request))).id),
  )

  app.get(
    '/v1/sessions/:id/setup/log',
    {
      schema: {
        tags: ['sessions'],
        summary: 'The log of the latest setup run (secrets redacted), as text',
        params: IdParams,
        response: { 200: bytesResponse('text/plain', 'The log, as text'), ...errors },
      },
    },
    async (request, reply) => {
      const row = await sessions.require(principalOf(request).tenantId, idOf(request))
      return reply.type('text/plain; charset=utf-8').send(await setup.log(row.id))
    },
  )

  app.get(
    '/v1/sessions/:id/resume-phase',
    {
      schema: {
        tags: ['sessions'],
        summary:
          "The latest run of the agent's session.resume command (before a cold start on an existing workspace): status, runs, exit code, log tail",
        params: IdParams,
        response: { 200: ResumeInfoSchema, ...errors },
      },
    },
    async (request) =>
      setup.resume.info((await sessions.require(principalOf(request).tenantId, idOf(request))).id),
  )

  app.get(
    '/v1/sessions/:id/resume-phase/log',
    {
      schema: {
        tags: ['sessions'],
        summary: 'The log of the latest run of the session.resume command (secrets redacted), as text',
        params: IdParams,
        response: { 200: bytesResponse('text/plain', 'The log, as text'), ...errors },
      },
    },
    async (request, reply) => {
      const row = await sessions.require(principalOf(request).tenantId, idOf(request))
      return reply.type('text/plain; charset=utf-8').send(await setup.resume.log(row.id))
    },
  )
}
