import type { AgentDetail, SessionInfo, SessionStatus, StreamEvent } from '@cairn/protocol'
import type {
  CompatAgent,
  CompatRunEvent,
  CompatSession,
  CompatSessionStatus,
  CompatStreamFormat,
} from './schemas.js'

/** Cairn's session statuses as theirs: a session ended by the user (or a limit) is `ended`. */
export function compatStatus(status: SessionStatus): CompatSessionStatus {
  return status === 'completed' ? 'ended' : status
}

export function cairnStatus(status: CompatSessionStatus): SessionStatus {
  return status === 'ended' ? 'completed' : status
}

export function toCompatSession(info: SessionInfo): CompatSession {
  return {
    id: info.id,
    agent_id: info.agentId,
    agent_name: info.agentName,
    status: compatStatus(info.status),
    title: info.title,
    message_count: info.messageCount,
    idle_timeout_seconds: Math.round(info.policy.idleTimeoutMs / 1000),
    created_at: info.createdAt,
    last_activity_at: info.lastActiveAt,
  }
}

const DEPS_STATUS = { DEPLOYING: 'building', READY: 'ready', FAILED: 'failed' } as const

/** An agent as theirs: its latest revision's build is their dependency install. */
export function toCompatAgent(
  detail: AgentDetail,
  secrets: { environmentKeys: string[]; requiredSecrets: string[] },
): CompatAgent {
  const latest = [...detail.revisions].sort((a, b) => b.createdAt.localeCompare(a.createdAt))[0]
  return {
    id: detail.id,
    name: detail.name,
    command: detail.command.length > 0 ? detail.command.join(' ') : null,
    environment_keys: secrets.environmentKeys,
    required_secrets: secrets.requiredSecrets,
    deps_status: latest ? DEPS_STATUS[latest.status] : 'building',
    deps_error: latest?.error ?? null,
    created_at: detail.createdAt,
    updated_at: detail.updatedAt,
  }
}

/**
 * Maps one run's events to theirs. Stateful: a tool.end without a duration of its own gets the
 * time since its tool.start (their SDK reports `duration_ms` for every tool call).
 */
export class RunEventMapper {
  private readonly toolStartedAt = new Map<string, number>()

  constructor(private readonly now: () => number = () => performance.now()) {}

  map(event: StreamEvent): CompatRunEvent {
    switch (event.type) {
      case 'run.started':
        return {
          type: 'run.started',
          data: { session_id: event.sessionId, turn_id: event.turnId, turn: event.turn },
        }
      case 'message.delta':
        return { type: 'message.delta', data: { content: event.content } }
      case 'tool.start':
        this.toolStartedAt.set(event.toolCallId, this.now())
        return {
          type: 'tool.start',
          data: {
            tool: event.name,
            tool_call_id: event.toolCallId,
            ...(event.input === undefined ? {} : { input: event.input }),
          },
        }
      case 'tool.end': {
        const startedAt = this.toolStartedAt.get(event.toolCallId)
        this.toolStartedAt.delete(event.toolCallId)
        const durationMs =
          event.durationMs ?? (startedAt === undefined ? 0 : Math.round(this.now() - startedAt))
        return {
          type: 'tool.end',
          data: {
            tool_call_id: event.toolCallId,
            duration_ms: durationMs,
            is_error: event.isError ?? false,
            ...(event.output === undefined ? {} : { output: event.output }),
          },
        }
      }
      case 'status':
        return { type: 'status', data: { message: event.message } }
      case 'approval.requested':
        // Their stream has no such event: a status line names the request.
        return {
          type: 'status',
          data: { message: `approval requested (${event.approvalId}): ${event.summary}` },
        }
      case 'run.completed':
        return {
          type: 'run.completed',
          data: { duration_ms: event.durationMs, max_turns_reached: false, text: event.text },
        }
      case 'run.failed':
        return {
          type: 'run.failed',
          data: {
            duration_ms: event.durationMs,
            error: { code: event.error.code, message: event.error.message },
          },
        }
      case 'run.cancelled':
        return { type: 'run.cancelled', data: { duration_ms: event.durationMs } }
      case 'heartbeat':
        return { type: 'heartbeat', data: { at: event.at } }
    }
  }
}

/**
 * One event in their SSE framing: its type on the `event:` line and its data on the `data:` line
 * (the agent-era clients read the type from the one and the payload from the other); `envelope`
 * puts the whole `{"type", "data"}` object on the `data:` line, for a client that asks for it.
 */
export function encodeCompatSse(event: CompatRunEvent, format: CompatStreamFormat = 'events'): string {
  const data = format === 'envelope' ? event : event.data
  return `event: ${event.type}\ndata: ${JSON.stringify(data)}\n\n`
}
