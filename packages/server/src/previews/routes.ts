import { CairnProblem, ErrorBodySchema, OkSchema, PreviewUrlSchema } from '@cairn/protocol'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { Type } from '@sinclair/typebox'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { requireWrite } from '../auth/plugin.js'
import type { PreviewOrigins } from './preview-origins.js'
import { DEFAULT_PREVIEW_TTL_MS, type PreviewService, parsePreviewTarget } from './preview-service.js'

const PortParams = Type.Object({
  id: Type.String({ minLength: 1, maxLength: 200 }),
  port: Type.Integer({ minimum: 1, maximum: 65535 }),
})
const SignedUrlBody = Type.Object(
  { ttlMs: Type.Optional(Type.Integer({ minimum: 1000, maximum: 7 * 24 * 3600 * 1000 })) },
  { additionalProperties: false },
)
const METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'] as const

/** The routes of the old preview paths, which only redirect. */
const REDIRECT_ROUTES = new Set(['/v1/sessions/:id/ports/:port', '/v1/sessions/:id/ports/:port/*'])

/**
 * Whether the bearer-key hook must leave a request alone: the old preview paths only redirect.
 * The route the router matched decides first (it decodes what the raw URL spells, so
 * `…/ports/80/ur%6c` is the signed-URL route, not a preview path).
 */
export function isPreviewRequest(request: FastifyRequest): boolean {
  if (!REDIRECT_ROUTES.has(request.routeOptions.url ?? '')) return false
  const target = parsePreviewTarget(request.url)
  // `…/ports/{port}/url` is the API's own path (signed URLs), whatever the method: never a preview's.
  const ownRoute = target?.rest === '/url'
  return target !== undefined && !ownRoute
}

/**
 * The API side of previews: signed URLs (on the preview's own origin, see PreviewOrigins) and their
 * revocation. The previews themselves are served by the preview listener only; the paths they had
 * here (`/v1/sessions/{id}/ports/{port}/…`) answer a redirect to the preview's origin, so no
 * content of a session ever runs on the origin of the console.
 */
export function previewRoutes(
  server: FastifyInstance,
  previews: PreviewService,
  origins: PreviewOrigins,
): void {
  const app = server.withTypeProvider<TypeBoxTypeProvider>()
  app.post(
    '/v1/sessions/:id/ports/:port/url',
    {
      schema: {
        tags: ['previews'],
        summary:
          "A signed URL to the service on a port inside the session sandbox, valid for ttlMs, on the preview's own origin; while the sandbox runs, refused unless the port listens in it (409 port_not_listening; 400 under a driver that cannot reach ports)",
        params: PortParams,
        body: SignedUrlBody,
        response: {
          200: PreviewUrlSchema,
          400: ErrorBodySchema,
          401: ErrorBodySchema,
          404: ErrorBodySchema,
          409: ErrorBodySchema,
        },
      },
    },
    async (request) => {
      const { id, port } = request.params
      const ttlMs = request.body.ttlMs ?? DEFAULT_PREVIEW_TTL_MS
      const tenantId = requireWrite(request).tenantId
      return previews.signedUrl(tenantId, id, port, ttlMs, (sessionId) => origins.originOf(sessionId, port))
    },
  )

  app.delete(
    '/v1/sessions/:id/ports/:port/url',
    {
      schema: {
        tags: ['previews'],
        summary:
          'Revoke every signed URL issued so far for a port of the session (and the cookies they left); later ones work',
        params: PortParams,
        response: {
          200: OkSchema,
          401: ErrorBodySchema,
          403: ErrorBodySchema,
          404: ErrorBodySchema,
        },
      },
    },
    async (request) => {
      const { id, port } = request.params
      await previews.revokeUrls(requireWrite(request).tenantId, id, port)
      return { ok: true }
    },
  )

  // Where previews were served before they had origins of their own: a redirect there, path and
  // query kept (signed URLs handed out before keep working). Bodies are left unread.
  void app.register(async (scope) => {
    scope.removeAllContentTypeParsers()
    scope.addContentTypeParser('*', (_request, _payload, done) => done(null, undefined))
    const redirect = async (request: FastifyRequest, reply: FastifyReply) => {
      const target = parsePreviewTarget(request.url)
      if (!target || target.rest === '/url')
        throw new CairnProblem('not_found', `no route ${request.method} ${request.url}`)
      const query = request.url.indexOf('?')
      const location = `${origins.originOf(target.sessionId, target.port)}${target.rest || '/'}${query < 0 ? '' : request.url.slice(query)}`
      return reply.redirect(location, 308)
    }
    scope.route({
      method: [...METHODS],
      url: '/v1/sessions/:id/ports/:port',
      schema: { hide: true },
      handler: redirect,
    })
    scope.route({
      method: [...METHODS],
      url: '/v1/sessions/:id/ports/:port/*',
      schema: { hide: true },
      handler: redirect,
    })
  })
}
