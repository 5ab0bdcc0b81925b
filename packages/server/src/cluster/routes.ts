import {
  CairnProblem,
  type NodeAction,
  NodeIdParamsSchema,
  NodeListSchema,
  NodeSchema,
  SessionMoveRequestSchema,
  SessionMoveSchema,
} from '@cairn/protocol'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { Type } from '@sinclair/typebox'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import { DEFAULT_TENANT_ID } from '../auth/api-keys.js'
import { principalOf } from '../auth/plugin.js'
import { errorResponses } from '../http/responses.js'
import type { ClusterHint } from './cluster-hints.js'
import type { SessionMover } from './moves/session-mover.js'
import type { NodeStore } from './node-store.js'

/** Nodes are the install's machines: only an admin key of the install (default tenant) sees them. */
function requireInstallAdmin(request: FastifyRequest): void {
  const principal = principalOf(request)
  if (principal.role !== 'admin' || principal.tenantId !== DEFAULT_TENANT_ID)
    throw new CairnProblem(
      'forbidden',
      "the cluster's nodes need an admin key of the install (default tenant)",
    )
}

const SUMMARIES: Record<NodeAction, string> = {
  cordon: 'Cordon a node: it keeps its sessions and takes no new ones',
  uncordon: 'Uncordon a node (cordoned or draining): it takes new sessions again',
  drain:
    "Drain a node: it takes no new sessions; the cluster's leader moves its idle sessions to other nodes. Drained when sessions and runningTurns are 0",
}

/**
 * `GET /v1/nodes` and `POST /v1/nodes/{id}/cordon|uncordon|drain`. Without a cluster (`nodes`
 * undefined: a SQLite server) the list is empty and no node exists.
 */
export function nodeRoutes(
  server: FastifyInstance,
  nodes: NodeStore | undefined,
  publish: ((hint: ClusterHint) => Promise<void>) | undefined,
  mover: SessionMover | undefined,
  /** The session `id` of `tenantId` (not_found otherwise). */
  sessionOf: (tenantId: string, id: string) => Promise<unknown>,
): void {
  const app = server.withTypeProvider<TypeBoxTypeProvider>()
  app.get(
    '/v1/nodes',
    {
      schema: {
        tags: ['nodes'],
        summary:
          "The cluster's runtime nodes: state, lease, capacity (CPUs, warm sandboxes, pool space), sessions and running turns",
        response: { 200: NodeListSchema, ...errorResponses(401, 403) },
      },
    },
    async (request) => {
      requireInstallAdmin(request)
      return { data: nodes ? await nodes.list() : [] }
    },
  )
  for (const action of ['cordon', 'uncordon', 'drain'] as const)
    app.post(
      `/v1/nodes/:id/${action}`,
      {
        schema: {
          tags: ['nodes'],
          summary: SUMMARIES[action],
          params: NodeIdParamsSchema,
          response: { 200: NodeSchema, ...errorResponses(400, 401, 403, 404, 409) },
        },
      },
      async (request) => {
        requireInstallAdmin(request)
        const { id } = request.params
        if (!nodes) throw new CairnProblem('not_found', `no node ${id} (this server is not in a cluster)`)
        const node = await nodes.apply(id, action)
        await publish?.({ kind: 'node.state', nodeId: node.id, state: node.state, epoch: node.epoch }).catch(
          () => {},
        )
        return node
      },
    )
  app.post(
    '/v1/sessions/:id/move',
    {
      schema: {
        tags: ['nodes'],
        summary:
          'Move a session to another node (toNode, or the one placement picks): the workspace is copied while the session is held (a message meanwhile gets session_moving, retryable), then its owner and owner epoch change. Install admin only',
        params: Type.Object({ id: Type.String({ minLength: 1, maxLength: 200 }) }),
        body: SessionMoveRequestSchema,
        response: { 200: SessionMoveSchema, ...errorResponses(400, 401, 403, 404, 409, 503) },
      },
    },
    async (request) => {
      // Another tenant's session is not found, as on every ID-taking route; one's own is forbidden
      // to all but the install's admin.
      const principal = principalOf(request)
      if (principal.tenantId !== DEFAULT_TENANT_ID) await sessionOf(principal.tenantId, request.params.id)
      requireInstallAdmin(request)
      if (!mover)
        throw new CairnProblem(
          'conflict',
          'sessions move between the nodes of a cluster: this server is not an API replica (--role api)',
        )
      return mover.moveById(request.params.id, request.body.toNode)
    },
  )
}
