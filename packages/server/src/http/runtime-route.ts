import type { Runtime } from '@cairn/runtime'
import { Type } from '@sinclair/typebox'
import type { FastifyInstance } from 'fastify'
import { principalOf } from '../auth/plugin.js'
import { type OperatorLimits, OperatorLimitsSchema } from '../limits/operator-limits.js'

const DriverSchema = Type.Object({
  name: Type.String(),
  default: Type.Boolean(),
  available: Type.Boolean(),
  reason: Type.Optional(Type.String()),
  capabilities: Type.Object({
    freeze: Type.Boolean(),
    network: Type.Boolean(),
    memorySnapshot: Type.Boolean(),
    ports: Type.Boolean(),
    transparentEgress: Type.Boolean(),
  }),
  description: Type.String(),
})

const StorageSchema = Type.Object({
  driver: Type.String(),
  capabilities: Type.Object({ quotas: Type.Boolean(), constantTimeCopies: Type.Boolean() }),
  description: Type.String(),
})

/** `GET /v1/runtime`: the sandbox drivers of this node, which one is the default, what each can do. */
export function runtimeRoute(app: FastifyInstance, runtime: Runtime, limits: OperatorLimits): void {
  app.get(
    '/v1/runtime',
    {
      schema: {
        tags: ['runtime'],
        summary:
          "Sandbox drivers (bwrap, gvisor), the workspace store (btrfs, dir) with their capabilities, and the operator's maxima",
        response: {
          200: Type.Object({
            drivers: Type.Array(DriverSchema),
            storage: StorageSchema,
            limits: OperatorLimitsSchema,
          }),
        },
      },
    },
    async (request) => {
      principalOf(request)
      const { pool } = runtime
      return {
        drivers: await runtime.isolations(),
        storage: {
          driver: pool.driver,
          capabilities: { ...pool.capabilities },
          description: pool.describe(),
        },
        limits,
      }
    },
  )
}
