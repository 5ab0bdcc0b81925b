import { CairnProblem, type StreamEvent } from '@cairn/protocol'

/** One AG-UI event as it goes on the wire (the data of an SSE event). */
export type AgUiEvent = { type: string } & Record<string, unknown>

/** The run a stream answers: the client's thread and run IDs, and Cairn's session and turn. */
export interface AgUiRun {
  threadId: string
  runId: string
  sessionId: string
  turnId: string
}

/**
 * A turn's stream events as AG-UI events: the reply as text messages (one per stretch between
 * tool calls), each tool call as start/args/end then its result, status lines as CUSTOM
 * `cairn.status`, the session and turn as STATE_SNAPSHOT (when the turn starts and when it
 * ends), the end as RUN_FINISHED (outcome success or cancelled) or RUN_ERROR (Cairn's code).
 */
export class AgUiEventMapper {
  private openText: string | undefined
  private texts = 0
  private reply = ''
  private started: { turn: number; sandboxId: string; coldStart: boolean } | undefined

  constructor(private readonly run: AgUiRun) {}

  /** The first event, sent once the turn has begun. */
  runStarted(): AgUiEvent {
    return { type: 'RUN_STARTED', threadId: this.run.threadId, runId: this.run.runId }
  }

  map(event: StreamEvent): AgUiEvent[] {
    const { threadId, runId, turnId } = this.run
    switch (event.type) {
      case 'run.started':
        this.started = { turn: event.turn, sandboxId: event.sandboxId, coldStart: event.coldStart }
        return [this.state('running')]
      case 'message.delta':
        if (event.content === '') return []
        this.reply += event.content
        return [
          ...this.textStart(),
          { type: 'TEXT_MESSAGE_CONTENT', messageId: this.openText, delta: event.content },
        ]
      case 'tool.start': {
        const toolCallId = `${turnId}-${event.toolCallId}`
        return [
          ...this.textEnd(),
          { type: 'TOOL_CALL_START', toolCallId, toolCallName: event.name },
          { type: 'TOOL_CALL_ARGS', toolCallId, delta: JSON.stringify(event.input ?? {}) },
          { type: 'TOOL_CALL_END', toolCallId },
        ]
      }
      case 'tool.end': {
        const toolCallId = `${turnId}-${event.toolCallId}`
        const content = typeof event.output === 'string' ? event.output : JSON.stringify(event.output ?? null)
        return [
          { type: 'TOOL_CALL_RESULT', messageId: `${toolCallId}-result`, toolCallId, content, role: 'tool' },
        ]
      }
      case 'status':
        return [{ type: 'CUSTOM', name: 'cairn.status', value: { message: event.message } }]
      case 'run.completed':
        return [
          ...this.textEnd(),
          this.state('completed', event.durationMs),
          {
            type: 'RUN_FINISHED',
            threadId,
            runId,
            result: { text: this.reply },
            outcome: { type: 'success' },
          },
        ]
      case 'run.cancelled':
        return [
          ...this.textEnd(),
          this.state('cancelled', event.durationMs),
          { type: 'RUN_FINISHED', threadId, runId, outcome: { type: 'cancelled' } },
        ]
      case 'run.failed':
        return [
          ...this.textEnd(),
          this.state('failed', event.durationMs),
          { type: 'RUN_ERROR', message: event.error.message, code: event.error.code },
        ]
      default:
        return []
    }
  }

  /** The end of a run that stopped without a terminal event (the turn could not be run). */
  failed(error: unknown): AgUiEvent[] {
    const problem =
      error instanceof CairnProblem
        ? error
        : new CairnProblem('internal', 'the run stopped without an outcome')
    return [...this.textEnd(), { type: 'RUN_ERROR', message: problem.message, code: problem.code }]
  }

  private textStart(): AgUiEvent[] {
    if (this.openText) return []
    this.openText = `${this.run.turnId}-text-${++this.texts}`
    return [{ type: 'TEXT_MESSAGE_START', messageId: this.openText, role: 'assistant' }]
  }

  private textEnd(): AgUiEvent[] {
    const messageId = this.openText
    this.openText = undefined
    return messageId ? [{ type: 'TEXT_MESSAGE_END', messageId }] : []
  }

  /** Cairn's state of the thread: its session and this turn (the client's state is not read). */
  private state(status: string, durationMs?: number): AgUiEvent {
    const { sessionId, turnId } = this.run
    return {
      type: 'STATE_SNAPSHOT',
      snapshot: {
        cairn: {
          sessionId,
          turnId,
          ...this.started,
          status,
          ...(durationMs === undefined ? {} : { durationMs }),
        },
      },
    }
  }
}
