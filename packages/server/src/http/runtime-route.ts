import { type NodeInfo, NodeSchema, SandboxDriverSchema } from '@cairn/protocol'
import type { RuntimePort } from '@cairn/runtime/port'
import { Type } from '@sinclair/typebox'
import type { FastifyInstance } from 'fastify'
import { DEFAULT_TENANT_ID } from '../auth/api-keys.js'
import { principalOf } from '../auth/plugin.js'
import { type OperatorLimits, OperatorLimitsSchema } from '../limits/operator-limits.js'
import { errorResponses } from './responses.js'

const Bytes = Type.Optional(Type.Integer({ minimum: 0 }))

const QuotasSchema = Type.Object(
  {
    enforced: Type.Boolean({ description: 'false: the storage driver cannot enforce quotas (see warnings)' }),
    workspaceBytes: Bytes,
    tenantBytes: Bytes,
    reserveBytes: Bytes,
    agentsTotalBytes: Bytes,
    imagesBytes: Type.Optional(
      Type.Integer({
        minimum: 0,
        description: 'what the shared agent images may hold together (--images-quota-mib)',
      }),
    ),
    accounting: Type.Optional(
      Type.Union([Type.Literal('simple'), Type.Literal('full')], {
        description:
          "simple: btrfs simple quotas (an extent counts for the tree that wrote it, including what the tree's snapshots still hold; snapshots and writes cost O(1)); full: qgroups (a pool that had them, or a kernel before 6.7; every snapshot's accounting walks the trees sharing its data)",
      }),
    ),
  },
  {
    description:
      "Storage limits: what a workspace wrote and still holds (its snapshots' share included), what a tenant's trees hold together, and the pool space kept free for Cairn (agents together get the rest)",
  },
)

const StorageWarningSchema = Type.Object({
  code: Type.Union([Type.Literal('quotas_unavailable'), Type.Literal('quotas_inexact')]),
  message: Type.String(),
})

const StorageSchema = Type.Object({
  driver: Type.String(),
  capabilities: Type.Object({ quotas: Type.Boolean(), constantTimeCopies: Type.Boolean() }),
  quotas: QuotasSchema,
  warnings: Type.Array(StorageWarningSchema),
  description: Type.String(),
})

/** `GET /v1/runtime`: the sandbox drivers of this node, which one is the default, what each can do. */
export function runtimeRoute(
  app: FastifyInstance,
  runtime: RuntimePort,
  limits: OperatorLimits,
  /** A cluster's nodes (undefined: not in a cluster). */
  nodes?: () => Promise<NodeInfo[]>,
): void {
  app.get(
    '/v1/runtime',
    {
      schema: {
        tags: ['runtime'],
        summary:
          "Sandbox drivers (bwrap, gvisor), the workspace store (btrfs, dir) with their capabilities, and the operator's maxima",
        response: {
          200: Type.Object({
            drivers: Type.Array(SandboxDriverSchema),
            storage: StorageSchema,
            limits: OperatorLimitsSchema,
            nodes: Type.Optional(
              Type.Array(NodeSchema, {
                description:
                  'In a cluster, to an admin key of the install: the runtime nodes and their state (as GET /v1/nodes)',
              }),
            ),
          }),
          ...errorResponses(401),
        },
      },
    },
    async (request) => {
      const principal = principalOf(request)
      const { warning, ...quotas } = await runtime.quotaStatus()
      const { drivers, storage } = await runtime.describe()
      return {
        drivers,
        storage: {
          driver: storage.driver,
          capabilities: storage.capabilities,
          quotas,
          warnings: warning ? [warning] : [],
          description: storage.description,
        },
        limits,
        ...(nodes && principal.role === 'admin' && principal.tenantId === DEFAULT_TENANT_ID
          ? { nodes: await nodes() }
          : {}),
      }
    },
  )
}
