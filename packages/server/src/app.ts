import { API_VERSION, CairnProblem, type ErrorBody, HealthSchema } from '@cairn/protocol'
import type { RuntimePort } from '@cairn/runtime/port'
import swagger from '@fastify/swagger'
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify'
import type { Logger } from 'pino'
import { a2aRoutes } from './a2a/routes.js'
import { AgUiThreads } from './ag-ui/ag-ui-threads.js'
import { agUiRoutes } from './ag-ui/routes.js'
import type { AgentService } from './agents/agent-service.js'
import type { ArchiveLimits } from './agents/archive.js'
import { agentRoutes } from './agents/routes.js'
import type { ApprovalService } from './approvals/approval-service.js'
import { approvalRoutes } from './approvals/routes.js'
import type { ApiKeyStore } from './auth/api-keys.js'
import { installAuth, type RateLimits } from './auth/plugin.js'
import { keyRoutes } from './auth/routes.js'
import type { ClusterHint } from './cluster/cluster-hints.js'
import type { SessionMover } from './cluster/moves/session-mover.js'
import { installNodeMetrics } from './cluster/node-metrics.js'
import type { NodeStore } from './cluster/node-store.js'
import { nodeRoutes } from './cluster/routes.js'
import { ClusterRuntimePort } from './cluster/routing/cluster-runtime-port.js'
import type { CommandService } from './commands/command-service.js'
import { commandRoutes } from './commands/routes.js'
import { compatError, compatRoutes } from './compat/routes.js'
import type { Db } from './db/database.js'
import { BodyBudget, bodyBudgetLimits, installBodyBudget, JSON_BODY_LIMIT_BYTES } from './http/body-budget.js'
import { consoleRoutes } from './http/console.js'
import {
  answerClientError,
  type BodyLimit,
  errorBody,
  installErrorHandlers,
  newRequestId,
} from './http/errors.js'
import { refuseNonFiniteNumbers } from './http/finite-numbers.js'
import { acceptEmptyBodies } from './http/optional-body.js'
import { documentFrameworkAnswers } from './http/responses.js'
import { runtimeRoute } from './http/runtime-route.js'
import { AJV_OPTIONS, typedBodyValidators } from './http/validators.js'
import { imageRoutes } from './images/routes.js'
import type { OperatorLimits } from './limits/operator-limits.js'
import { mcpRoutes } from './mcp/routes.js'
import type { ArtifactStore } from './memory/artifact-store.js'
import type { MemoryService } from './memory/memory-service.js'
import { memoryRoutes } from './memory/routes.js'
import type { MetricsRegistry } from './metrics/registry.js'
import { installMetrics } from './metrics/route.js'
import { installShippingMetrics, type NodeLag } from './metrics/shipping-metrics.js'
import type { PreviewOrigins } from './previews/preview-origins.js'
import type { PreviewService } from './previews/preview-service.js'
import { isPreviewRequest, previewRoutes } from './previews/routes.js'
import type { RetentionService } from './retention/retention-service.js'
import { retentionRoutes } from './retention/routes.js'
import { secretRoutes } from './secrets/routes.js'
import type { SecretStore } from './secrets/secret-store.js'
import { sessionRoutes } from './sessions/routes.js'
import type { SessionService } from './sessions/session-service.js'
import { setupRoutes } from './setup/routes.js'
import type { SetupService } from './setup/setup-service.js'
import { webhookRoutes } from './webhooks/routes.js'
import type { WebhookStore } from './webhooks/webhook-store.js'
import { workspaceRoutes } from './workspace/routes.js'
import type { WorkspaceService } from './workspace/workspace-service.js'

export interface AppDeps {
  logger: Logger
  /** Commands in sessions' sandboxes outside turns. */
  commands: CommandService
  keys: ApiKeyStore
  db: Db
  agents: AgentService
  sessions: SessionService
  secrets: SecretStore
  workspace: WorkspaceService
  retention: RetentionService
  metrics: MetricsRegistry
  memory: MemoryService
  artifacts: ArtifactStore
  previews: PreviewService
  /** Where previews are served (the preview listener); the API serves none itself. */
  previewOrigins: PreviewOrigins
  setup: SetupService
  webhooks: WebhookStore
  /** Agents' approval requests (human review). */
  approvals: ApprovalService
  /** The runtime, only through its port. */
  runtime: RuntimePort
  maxUploadBytes: number
  /**
   * What request bodies (and terminal sockets' input) may hold at once, per tenant and in all,
   * shared with the terminal sockets (default: one of BodyBudget's default limits).
   */
  bodyBudget?: BodyBudget | undefined
  /** The per-key and per-tenant budgets, shared with the other ways in (terminal sockets). */
  rateLimits: RateLimits
  /** The operator's maxima (shown at `GET /v1/runtime`; the tenant rate and key count are enforced here). */
  operatorLimits: OperatorLimits
  /** Interval of the heartbeat events on SSE streams (default 15 s). */
  sseHeartbeatMs?: number | undefined
  /** How long a client may read nothing of a full SSE stream before it is cut (default 60 s). */
  sseStallMs?: number | undefined
  version: string
  /**
   * Where the hosted agent-session API's compatibility routes are served (`/superserve` → its
   * clients use `/superserve/v1/…`); undefined: not served. See docs/compat.md.
   */
  compat?: { prefix: string; archiveLimits: ArchiveLimits } | undefined
  /**
   * The cluster's nodes (a server on PostgreSQL): `/v1/nodes`, node status in `/v1/runtime` and
   * per-node figures in `/metrics`. Undefined: not in a cluster (the list is empty).
   */
  cluster?:
    | { nodes: NodeStore; publish?: (hint: ClusterHint) => Promise<void>; mover?: SessionMover | undefined }
    | undefined
}

const JSON_LIMIT: BodyLimit = { bytes: JSON_BODY_LIMIT_BYTES, applies: 'JSON bodies' }
/** Bodies taken as raw bytes (archives, file contents), under the upload limit. */
const UPLOAD_MEDIA_TYPES = [
  'application/gzip',
  'application/x-gzip',
  'application/x-tar+gzip',
  'application/octet-stream',
  'text/plain',
] as const

function isUploadMediaType(contentType: string | undefined): boolean {
  const mediaType = contentType?.split(';')[0]?.trim().toLowerCase() ?? ''
  return (UPLOAD_MEDIA_TYPES as readonly string[]).includes(mediaType)
}
/** Longest path parameter the router accepts; above the schemas' own limits (IDs: 200), so those answer. */
const MAX_PARAM_LENGTH = 1024

/** Builds the HTTP API. Handlers are thin: each validates, authorises and calls a service. */
export async function buildApp(deps: AppDeps): Promise<FastifyInstance> {
  // Errors of the compat API (under its prefix) are answered in its shape, wherever they arise.
  const compatPrefix = deps.compat ? `${deps.compat.prefix}/` : undefined
  const shapeError = (request: FastifyRequest, body: ErrorBody): unknown =>
    compatPrefix && request.url.startsWith(compatPrefix) ? compatError(body.error, request.id) : body
  const app = Fastify({
    // Per-request access logs are dropped (they cost more than the warm turn itself); errors and
    // 4xx answers are logged by the hooks below.
    loggerInstance: deps.logger.child(
      { component: 'http' },
      { level: deps.logger.levelVal > 40 ? deps.logger.level : 'warn' },
    ),
    bodyLimit: JSON_LIMIT.bytes,
    genReqId: newRequestId,
    // Refusals of the HTTP parser (headers too large, a request too slow) in the registry's shape.
    clientErrorHandler: answerClientError,
    routerOptions: { maxParamLength: MAX_PARAM_LENGTH },
    // The router's own refusals (bad percent-encoding, over-long parameters) bypass the error
    // handler; without this they answer in Fastify's shape, with no registry code.
    frameworkErrors: (error, request, reply) => {
      const message =
        error.code === 'FST_ERR_MAX_PARAM_LENGTH'
          ? `a path parameter is longer than ${MAX_PARAM_LENGTH} characters`
          : 'the request path is not valid percent-encoded UTF-8'
      void (reply as FastifyReply)
        .status(400)
        .send(shapeError(request as FastifyRequest, errorBody('bad_request', message, request.id)))
    },
    ajv: { customOptions: { ...AJV_OPTIONS } },
    schemaController: { compilersFactory: { buildValidator: typedBodyValidators() } },
  }) as unknown as FastifyInstance
  const uploadLimit: BodyLimit = { bytes: deps.maxUploadBytes, applies: 'uploads' }
  installErrorHandlers(
    app,
    (request) => (isUploadMediaType(request.headers['content-type']) ? uploadLimit : JSON_LIMIT),
    shapeError,
  )
  // The listener lets a request without Host through (admission.ts) for this typed answer.
  app.addHook('onRequest', async (request) => {
    if (request.raw.httpVersion === '1.1' && request.headers.host === undefined)
      throw new CairnProblem('bad_request', 'an HTTP/1.1 request needs a Host header')
  })
  refuseNonFiniteNumbers(app)
  acceptEmptyBodies(app, isPreviewRequest)
  app.addContentTypeParser(
    [...UPLOAD_MEDIA_TYPES],
    { parseAs: 'buffer', bodyLimit: uploadLimit.bytes },
    (_request, body, done) => done(null, body),
  )
  // An empty body is no body: many clients send `Content-Type: application/json` on every request,
  // body-less ones (end, resume, delete …) included. A route that needs a body says so in validation.
  const parseJson = app.getDefaultJsonParser('error', 'error')
  app.removeContentTypeParser('application/json')
  app.addContentTypeParser(
    'application/json',
    { parseAs: 'string', bodyLimit: JSON_LIMIT.bytes },
    (request, body, done) =>
      body.length === 0 ? done(null, undefined) : parseJson(request, String(body), done),
  )
  await app.register(swagger, {
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'Cairn API',
        version: API_VERSION,
        description: 'Persistent, isolated agent sessions',
        license: { name: 'Apache-2.0', identifier: 'Apache-2.0' },
      },
      // Relative: the API is served from wherever this document is.
      servers: [{ url: '/', description: 'This Cairn server' }],
      components: { securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } } },
      security: [{ bearer: [] }],
    },
  })
  documentFrameworkAnswers(app)
  installAuth(app, deps.keys, deps.rateLimits, isPreviewRequest)
  installBodyBudget(
    app,
    deps.bodyBudget ?? new BodyBudget(bodyBudgetLimits({}, deps.maxUploadBytes)),
    Math.max(deps.maxUploadBytes, JSON_BODY_LIMIT_BYTES),
  )
  app.get('/healthz', { schema: { hide: true, response: { 200: HealthSchema } } }, async () => ({
    ok: true,
    version: deps.version,
  }))
  const cluster = deps.cluster
  installMetrics(
    app,
    deps.metrics,
    deps.sessions,
    deps.db,
    deps.runtime,
    beforeEach([
      cluster ? installNodeMetrics(deps.metrics, () => cluster.nodes.list()) : undefined,
      installShippingMetrics(deps.metrics, () => shippingLags(deps.runtime)),
    ]),
  )
  app.get('/v1/openapi.json', { schema: { hide: true } }, async () => app.swagger())
  keyRoutes(app, deps.keys, { maxKeysPerTenant: deps.operatorLimits.maxKeysPerTenant })
  const sse = { heartbeatMs: deps.sseHeartbeatMs, stallMs: deps.sseStallMs }
  agentRoutes(app, deps.agents, sse)
  sessionRoutes(app, deps.sessions, sse)
  secretRoutes(app, deps.agents, deps.secrets)
  workspaceRoutes(app, deps.workspace)
  mcpRoutes(app, {
    agents: deps.agents,
    commands: deps.commands,
    sessions: deps.sessions,
    workspace: deps.workspace,
    version: deps.version,
    logger: app.log,
  })
  commandRoutes(app, deps.commands, sse)
  retentionRoutes(app, deps.retention)
  imageRoutes(app, deps.agents.images)
  memoryRoutes(app, deps.memory, deps.artifacts, deps.agents, deps.sessions)
  previewRoutes(app, deps.previews, deps.previewOrigins)
  setupRoutes(app, deps.setup, deps.sessions)
  webhookRoutes(app, deps.webhooks)
  approvalRoutes(app, deps.approvals)
  runtimeRoute(app, deps.runtime, deps.operatorLimits, cluster ? () => cluster.nodes.list() : undefined)
  nodeRoutes(app, cluster?.nodes, cluster?.publish, cluster?.mover, (tenantId, id) =>
    deps.sessions.get(tenantId, id),
  )
  a2aRoutes(app, { ...deps, version: deps.version, sse })
  agUiRoutes(app, { ...deps, threads: new AgUiThreads(deps), sse })
  consoleRoutes(app)
  const compat = deps.compat
  if (compat) {
    await app.register(
      (scope) =>
        compatRoutes(scope, {
          keys: deps.keys,
          agents: deps.agents,
          sessions: deps.sessions,
          secrets: deps.secrets,
          archiveLimits: compat.archiveLimits,
          maxUploadBytes: deps.maxUploadBytes,
          rateLimits: deps.rateLimits,
        }),
      { prefix: compat.prefix },
    )
  }
  // Node's server.close closes the keep-alive connections idle at that moment only; one whose
  // response ends after it would be held open for keepAliveTimeout (72 s), and the close with it.
  let closing = false
  app.addHook('preClose', async () => {
    closing = true
  })
  app.addHook('onResponse', async () => {
    if (closing) app.server.closeIdleConnections()
  })
  app.addHook('onResponse', async (request, reply) => {
    if (reply.statusCode >= 400) {
      request.log.warn(
        { method: request.method, url: request.url.split('?')[0], status: reply.statusCode },
        'request',
      )
    }
  })
  return app
}

/** Runs every reader before a scrape. */
function beforeEach(readers: ((() => Promise<void>) | undefined)[]): () => Promise<void> {
  return async () => {
    await Promise.all(readers.map((read) => read?.()))
  }
}

/** Each node's shipping lag: every serving node's in a cluster, this process's own otherwise. */
async function shippingLags(runtime: RuntimePort): Promise<NodeLag[]> {
  if (runtime instanceof ClusterRuntimePort) return runtime.shippingLagByNode()
  return [{ node: 'local', lag: await runtime.shippingLag() }]
}
