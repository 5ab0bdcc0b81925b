import { type Static, Type } from '@sinclair/typebox'

/**
 * A runtime node's state: `ready` takes new sessions; `cordoned` keeps its sessions and takes no
 * new ones; `draining` takes no new ones and hands its sessions over as they go idle (the cluster's
 * leader moves each idle session to another node until none is left); `lost` was declared dead by the leader (lease
 * ended or process gone); `stopped` shut down cleanly.
 */
export const NODE_STATES = ['ready', 'cordoned', 'draining', 'lost', 'stopped'] as const
export type NodeState = (typeof NODE_STATES)[number]

export const NodeStateSchema = Type.Union(NODE_STATES.map((state) => Type.Literal(state)))

/** One runtime node of a cluster (`cairn node`), as its row in the database says. */
export const NodeSchema = Type.Object({
  /** The node's runtime ID (`rt_…`). */
  id: Type.String(),
  name: Type.String(),
  /** Where API replicas reach its runtime port (`https://host:port`). */
  address: Type.String(),
  /** The machine's boot ID when the node registered (a new one: the machine rebooted). */
  bootId: Type.String(),
  state: NodeStateSchema,
  /** Sandbox drivers available on the node. */
  drivers: Type.Array(Type.String()),
  cpus: Type.Integer({ minimum: 0 }),
  warmSandboxes: Type.Integer({ minimum: 0 }),
  poolFreeBytes: Type.Optional(Type.Integer({ minimum: 0 })),
  poolSizeBytes: Type.Optional(Type.Integer({ minimum: 0 })),
  /** Incarnation: one more at each registration. */
  epoch: Type.Integer({ minimum: 0 }),
  /** Sessions the node owns (not deleted). */
  sessions: Type.Integer({ minimum: 0 }),
  /** Turns running on the node now: a draining node is drained when none is left. */
  runningTurns: Type.Integer({ minimum: 0 }),
  /** Whether the lease is still running now (a `ready` node whose lease ended is about to be `lost`). */
  leaseLive: Type.Boolean(),
  leaseExpiresAt: Type.String(),
  heartbeatAt: Type.String(),
  registeredAt: Type.String(),
  lostAt: Type.Optional(Type.String()),
})
export type NodeInfo = Static<typeof NodeSchema>

export const NodeListSchema = Type.Object({ data: Type.Array(NodeSchema) })
export type NodeList = Static<typeof NodeListSchema>

export const NodeIdParamsSchema = Type.Object({ id: Type.String({ minLength: 1, maxLength: 200 }) })

/** `POST /v1/nodes/{id}/cordon|uncordon|drain`: the node as it is now. */
export const NODE_ACTIONS = ['cordon', 'uncordon', 'drain'] as const
export type NodeAction = (typeof NODE_ACTIONS)[number]

/** `POST /v1/sessions/{id}/move`: where to (a node ID); absent, placement picks a ready node. */
export const SessionMoveRequestSchema = Type.Object(
  { toNode: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })) },
  { additionalProperties: false },
)
export type SessionMoveRequest = Static<typeof SessionMoveRequestSchema>

/** A finished move: the session now lives on `toNode`, its calls carry `ownerEpoch`. */
export const SessionMoveSchema = Type.Object({
  sessionId: Type.String(),
  fromNode: Type.String(),
  toNode: Type.String(),
  ownerEpoch: Type.Integer({ minimum: 0 }),
  /**
   * How the workspace crossed: `bucket` (the last increment shipped, restored on the target from
   * the session's chain) or `direct` (exported from the source, unpacked on the target).
   */
  via: Type.Union([Type.Literal('bucket'), Type.Literal('direct')]),
  /** The workspace's digest, the same on both nodes (checked before the owner changed). */
  digest: Type.String(),
  /**
   * Bytes of running state carried (the sandbox's memory checkpoint: its processes go on on the
   * target at the next message); absent when the sandbox was stopped instead (it cannot be
   * checkpointed, or none ran).
   */
  memoryBytes: Type.Optional(Type.Integer({ minimum: 0 })),
  /** How long the move took, from the hold to the source's copy deleted. */
  durationMs: Type.Number({ minimum: 0 }),
})
export type SessionMove = Static<typeof SessionMoveSchema>
