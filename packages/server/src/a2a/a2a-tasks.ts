import {
  type Artifact,
  type Message,
  type Part,
  Role,
  type StreamResponse,
  type Task,
  TaskState,
  type TaskStatus,
} from '@a2a-js/sdk'
import type { StreamEvent, TurnStatus, WorkspaceDiff } from '@cairn/protocol'

/** How many changed files a turn's files artifact links to (the list in its data part is whole). */
export const MAX_LINKED_FILES = 50

/** A turn as an A2A task: its ID is the turn's, its context the session's. */
export interface TurnRef {
  turnId: string
  sessionId: string
}

const STATES: Record<TurnStatus, TaskState> = {
  running: TaskState.TASK_STATE_WORKING,
  completed: TaskState.TASK_STATE_COMPLETED,
  failed: TaskState.TASK_STATE_FAILED,
  cancelled: TaskState.TASK_STATE_CANCELED,
  interrupted: TaskState.TASK_STATE_FAILED,
}

/** A turn's status as a task's state (a status this version does not know: failed). */
export function taskState(status: string): TaskState {
  return STATES[status as TurnStatus] ?? TaskState.TASK_STATE_FAILED
}

export const textPart = (text: string): Part => ({
  content: { $case: 'text', value: text },
  metadata: undefined,
  filename: '',
  mediaType: '',
})

const dataPart = (value: unknown): Part => ({
  content: { $case: 'data', value },
  metadata: undefined,
  filename: '',
  mediaType: 'application/json',
})

/** A message of the turn: the user's prompt or the agent's words. */
export function turnMessage(ref: TurnRef, role: 'user' | 'agent', parts: Part[], messageId: string): Message {
  return {
    messageId,
    contextId: ref.sessionId,
    taskId: ref.turnId,
    role: role === 'user' ? Role.ROLE_USER : Role.ROLE_AGENT,
    parts,
    metadata: undefined,
    extensions: [],
    referenceTaskIds: [],
  }
}

export function status(state: TaskState, message?: Message): TaskStatus {
  return { state, message, timestamp: new Date().toISOString() }
}

/** The agent's reply as an artifact (`append` chunks while streaming, whole otherwise). */
export function replyArtifact(ref: TurnRef, text: string): Artifact {
  return {
    artifactId: `${ref.turnId}-reply`,
    name: 'reply',
    description: "The agent's reply",
    parts: [textPart(text)],
    metadata: undefined,
    extensions: [],
  }
}

/**
 * The files the turn changed in /workspace: the lists as a data part, and each added or changed
 * file (up to MAX_LINKED_FILES) as a link to the files API (read with the same API key).
 */
export function filesArtifact(ref: TurnRef, diff: WorkspaceDiff, baseUrl: string): Artifact {
  const { added, changed, deleted, truncated } = diff
  const links = [...added, ...changed].slice(0, MAX_LINKED_FILES).map(
    (file): Part => ({
      content: {
        $case: 'url',
        value: `${baseUrl}/v1/sessions/${ref.sessionId}/files/content?path=${encodeURIComponent(file)}`,
      },
      metadata: undefined,
      filename: file,
      mediaType: '',
    }),
  )
  return {
    artifactId: `${ref.turnId}-files`,
    name: 'changed files',
    description: 'Files of /workspace the turn added, changed or deleted (paths relative to /workspace)',
    parts: [dataPart({ added, changed, deleted, truncated }), ...links],
    metadata: undefined,
    extensions: [],
  }
}

export function task(
  ref: TurnRef,
  taskStatus: TaskStatus,
  artifacts: Artifact[],
  history: Message[],
  metadata: Record<string, unknown>,
): Task {
  return { id: ref.turnId, contextId: ref.sessionId, status: taskStatus, artifacts, history, metadata }
}

const statusUpdate = (
  ref: TurnRef,
  taskStatus: TaskStatus,
  metadata?: Record<string, unknown>,
): StreamResponse => ({
  payload: {
    $case: 'statusUpdate',
    value: { taskId: ref.turnId, contextId: ref.sessionId, status: taskStatus, metadata },
  },
})

export const artifactUpdate = (
  ref: TurnRef,
  artifact: Artifact,
  append: boolean,
  lastChunk: boolean,
): StreamResponse => ({
  payload: {
    $case: 'artifactUpdate',
    value: { taskId: ref.turnId, contextId: ref.sessionId, artifact, append, lastChunk, metadata: undefined },
  },
})

/**
 * A turn's stream events as A2A stream responses: the reply as chunks of one artifact, tool
 * calls and status lines as `working` updates whose message carries them, the end as the final
 * status (`completed`, `failed` with Cairn's error code, `canceled`).
 */
export class TaskEventMapper {
  private chunks = 0
  private text = ''
  private messages = 0

  constructor(private readonly ref: TurnRef) {}

  /** The reply so far. */
  get reply(): string {
    return this.text
  }

  map(event: StreamEvent): StreamResponse[] {
    switch (event.type) {
      case 'message.delta':
        if (event.content === '') return []
        this.text += event.content
        return [artifactUpdate(this.ref, replyArtifact(this.ref, event.content), this.chunks++ > 0, false)]
      case 'tool.start':
        return [
          this.working([
            dataPart({ toolCall: { id: event.toolCallId, name: event.name, input: event.input } }),
          ]),
        ]
      case 'tool.end': {
        const { toolCallId, output, isError, durationMs } = event
        return [this.working([dataPart({ toolResult: { id: toolCallId, output, isError, durationMs } })])]
      }
      case 'status':
        return [this.working([textPart(event.message)])]
      case 'run.completed':
        return [
          ...(this.chunks > 0 ? [artifactUpdate(this.ref, replyArtifact(this.ref, ''), true, true)] : []),
        ]
      case 'run.failed':
        return [
          statusUpdate(
            this.ref,
            status(TaskState.TASK_STATE_FAILED, this.agentMessage([textPart(event.error.message)])),
            { cairn: { code: event.error.code } },
          ),
        ]
      case 'run.cancelled':
        return [statusUpdate(this.ref, status(TaskState.TASK_STATE_CANCELED))]
      default:
        return []
    }
  }

  /** The final `completed` update (after the files artifact, when there is one). */
  completed(): StreamResponse {
    return statusUpdate(
      this.ref,
      status(TaskState.TASK_STATE_COMPLETED, this.agentMessage([textPart(this.text)])),
    )
  }

  private working(parts: Part[]): StreamResponse {
    return statusUpdate(this.ref, status(TaskState.TASK_STATE_WORKING, this.agentMessage(parts)))
  }

  private agentMessage(parts: Part[]): Message {
    return turnMessage(this.ref, 'agent', parts, `${this.ref.turnId}-m${++this.messages}`)
  }
}
