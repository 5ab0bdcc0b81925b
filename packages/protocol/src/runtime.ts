import { type Static, Type } from '@sinclair/typebox'

/** A sandbox driver of `GET /v1/runtime`: whether it runs here and what it can do. */
export const SandboxDriverSchema = Type.Object({
  name: Type.String(),
  default: Type.Boolean(),
  available: Type.Boolean(),
  reason: Type.Optional(Type.String()),
  capabilities: Type.Object({
    freeze: Type.Boolean(),
    network: Type.Boolean(),
    memorySnapshot: Type.Boolean(),
    residentPause: Type.Optional(
      Type.Boolean({
        description:
          "pause: memory as a resident pause: the sandbox frozen in place (memory in RAM) until its next message thaws it or the node releases it; with memorySnapshot the release checkpoints it, without it (bwrap) the release ends its memory and the next message starts cold with the reason in the session's events. Absent from servers before it.",
      }),
    ),
    ports: Type.Boolean(),
    transparentEgress: Type.Boolean(),
  }),
  capabilityReasons: Type.Optional(
    Type.Record(Type.String(), Type.String(), {
      description:
        'Why a capability the driver lacks cannot be had on this node, by capability (memorySnapshot for bwrap: what keeps CRIU from checkpointing it)',
    }),
  ),
  platform: Type.Optional(
    Type.String({
      description:
        'gvisor: the platform its sandboxes run on (systrap where runsc offers it and it starts a sandbox here, else ptrace; CAIRN_GVISOR_PLATFORM names one)',
    }),
  ),
  platformReason: Type.Optional(
    Type.String({ description: 'gvisor: why the platform is ptrace on a runsc that offers systrap' }),
  ),
  description: Type.String(),
})
export type SandboxDriver = Static<typeof SandboxDriverSchema>

/** The part of `GET /v1/runtime` the SDK reads: the node's sandbox drivers (other fields pass unchecked). */
export const RuntimeDriversSchema = Type.Object({ drivers: Type.Array(SandboxDriverSchema) })
