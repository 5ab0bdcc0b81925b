import type {
  AgentProtocolName,
  ApprovalAnswer,
  ErrorCode,
  HttpAgent,
  StatusCause,
  TranscriptLine,
} from '@cairn/protocol'
import type { EgressRoute } from '../egress/proxy.js'
import type { ProxySecret } from '../egress/proxy-secrets.js'
import type { IsolationName, SandboxBind, SandboxLimits } from '../sandbox/driver.js'

export type AgentEvent =
  | { type: 'text'; content: string }
  | { type: 'status'; message: string }
  | { type: 'tool.start'; id: string; name: string; input?: unknown }
  | { type: 'tool.end'; id: string; output?: unknown; isError?: boolean }
  | { type: 'metadata'; data: Record<string, unknown> }
  | { type: 'approval.request'; summary: string; action?: unknown }

export type TurnOutcome =
  | { status: 'completed'; text: string; stderr: string; agentExited: boolean }
  | {
      status: 'failed'
      code: ErrorCode
      cause: StatusCause
      message: string
      text: string
      stderr: string
    }
  | { status: 'cancelled'; text: string; stderr: string }

export interface TurnInput {
  prompt: string
  turn: number
  turnId: string
  /** Transcript before this turn, written to `$CAIRN_TRANSCRIPT` for the agent. */
  transcript: readonly TranscriptLine[]
  /** The answer to the agent's approval request this turn carries (jsonl: in the frame; http: in the body). */
  approval?: ApprovalAnswer | undefined
}

export interface AgentLaunch {
  sessionId: string
  workspaceDir: string
  command: readonly string[]
  protocol: AgentProtocolName
  /** Where an `http` agent listens (cairn.yaml's `http`); required with that protocol. */
  http?: HttpAgent | undefined
  env: Readonly<Record<string, string>>
  limits: SandboxLimits
  turnTimeoutMs: number
  /** Extra mounts, such as the revision's dependency environment at /env. */
  binds?: readonly SandboxBind[] | undefined
  /** A writable home of the sandbox's own (`SandboxSpec.home`; agents with persisted paths). */
  home?: string | undefined
  /** The image's root filesystem (`SandboxSpec.rootfs`); unset: the host's /usr. */
  rootfs?: string | undefined
  /** The sandbox driver to run under; the runtime's default (`RuntimeOptions.isolation`) when unset. */
  isolation?: IsolationName | undefined
  /** Egress allowlist; without one (or with an empty one) the sandbox has loopback only. */
  egress?:
    | (EgressRoute & {
        /**
         * `proxy`-scoped secrets: the agent's environment holds each stand-in (put it in `env`),
         * the proxy swaps in the value towards the secret's hosts, terminating TLS for them.
         */
        secrets?: readonly ProxySecret[] | undefined
        /** Extra CA certificates (PEM) the proxy trusts for upstream TLS. */
        upstreamCaPems?: readonly string[] | undefined
      })
    | undefined
  /** Most reply characters one turn may produce (default 8 Mi). */
  maxOutputChars?: number | undefined
  /** The sandbox will be checkpointed when it cools (`pause: memory`; see `SandboxSpec.checkpointable`). */
  checkpointable?: boolean | undefined
  /** Restores the sandbox from a memory checkpoint instead of starting its command (see checkpoint/). */
  resume?: AgentResume | undefined
}

/** What AgentProcess knows of a running agent that its next process must know to talk to it. */
export interface AgentMemoryState {
  /** The protocol's (stdio: the marker's nonce in the agent's environment, lines sent and asked). */
  protocol: ProtocolState
}

export interface AgentResume {
  /** Where `SandboxDriver.checkpoint` wrote the image. */
  imageDir: string
  state: AgentMemoryState
  /**
   * The id of the sandbox booted ahead for this restore (`SandboxDriver.prepareRestore`): the
   * agent's sandbox takes that id, and the driver restores into it when it is still there.
   */
  targetId?: string | undefined
}

export const DEFAULT_LIMITS: SandboxLimits = { memoryMiB: 512, pids: 256, cpus: 1 }
export const DEFAULT_MAX_OUTPUT_CHARS = 8 * 1024 * 1024
export const DEFAULT_TURN_TIMEOUT_MS = 10 * 60 * 1000

/** A protocol's state across a memory checkpoint (see `AgentProtocol.state`). */
export type ProtocolState = Readonly<Record<string, string | number>>
