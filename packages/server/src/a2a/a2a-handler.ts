import type {
  AgentCard,
  Artifact,
  CancelTaskRequest,
  GetTaskRequest,
  Message,
  Part,
  SendMessageRequest,
  StreamResponse,
  SubscribeToTaskRequest,
  Task,
} from '@a2a-js/sdk'
import {
  A2AError,
  PushNotificationNotSupportedError,
  RequestMalformedError,
  TaskNotCancelableError,
  TaskNotFoundError,
  UnsupportedOperationError,
} from '@a2a-js/sdk/errors'
import type { A2ARequestHandler } from '@a2a-js/sdk/server'
import { CairnProblem, MAX_PROMPT_BYTES, type StreamEvent } from '@cairn/protocol'
import type { Logger } from 'pino'
import { EventPipe } from '../http/event-pipe.js'
import type { SessionService } from '../sessions/session-service.js'
import type { StoredTurn } from '../sessions/session-store.js'
import type { TurnEmit } from '../sessions/turn-runner.js'
import type { WorkspaceService } from '../workspace/workspace-service.js'
import {
  artifactUpdate,
  filesArtifact,
  replyArtifact,
  status,
  TaskEventMapper,
  type TurnRef,
  task,
  taskState,
  textPart,
  turnMessage,
} from './a2a-tasks.js'

/** How long `CancelTask` waits for the cancelled turn to end before it answers with its state then. */
const CANCEL_WAIT_MS = 30_000

export interface A2AServices {
  sessions: SessionService
  workspace: WorkspaceService
  logger: Logger
}

/** Who asks and of which agent: one request's view (a handler is made per request). */
export interface A2AScope {
  tenantId: string
  agent: { id: string; name: string }
  card: AgentCard
  /** Where the API is, as the client reached it (links in artifacts). */
  baseUrl: string
}

/**
 * A2A's operations on Cairn's session and turn services: a context is a session (its ID), a task
 * a turn (its ID). Nothing is kept here: a task is read back from the turn's row, a stream is the
 * turn's own event stream translated (see a2a-tasks.ts).
 */
export class CairnA2AHandler implements A2ARequestHandler {
  constructor(
    private readonly services: A2AServices,
    private readonly scope: A2AScope,
  ) {}

  async getAgentCard(): Promise<AgentCard> {
    return this.scope.card
  }

  async getAuthenticatedExtendedAgentCard(): Promise<AgentCard> {
    return this.scope.card
  }

  sendMessage(params: SendMessageRequest): Promise<Message | Task> {
    return translated(async () => {
      const turn = await this.begin(params)
      if (params.configuration?.returnImmediately) {
        void turn
          .run(() => undefined)
          .catch((error: unknown) => {
            this.services.logger.warn(
              { err: error, turnId: turn.ref.turnId },
              'a2a: turn failed in the background',
            )
          })
        return this.openTask(turn.ref, turn.prompt)
      }
      await turn.run(() => undefined)
      const stored = await this.services.sessions.turn(this.scope.tenantId, turn.ref.turnId)
      const files = stored.status === 'completed' ? await this.changedFiles(turn.ref, stored.seq) : undefined
      return this.storedTask(stored, files)
    }, 'params')
  }

  async *sendMessageStream(params: SendMessageRequest): AsyncGenerator<StreamResponse, void, undefined> {
    const turn = await translated(() => this.begin(params), 'params')
    yield { payload: { $case: 'task', value: this.openTask(turn.ref, turn.prompt) } }
    yield* this.follow(turn.ref, turn.run)
  }

  getTask(params: GetTaskRequest): Promise<Task> {
    return translated(async () => this.storedTask(await this.ownTurn(params.id)), 'task')
  }

  cancelTask(params: CancelTaskRequest): Promise<Task> {
    return translated(async () => {
      const turn = await this.ownTurn(params.id)
      if (turn.status !== 'running')
        throw new TaskNotCancelableError({
          message: `task ${turn.id} is ${turn.status}: only a running task can be cancelled`,
          metadata: { code: 'conflict' },
        })
      const { sessions } = this.services
      await sessions.cancel(this.scope.tenantId, turn.sessionId)
      const replay = await sessions.replayTurn(this.scope.tenantId, turn.sessionId, turn.id, 0)
      await replay?.stream(() => undefined, AbortSignal.timeout(CANCEL_WAIT_MS))
      return this.storedTask(await sessions.turn(this.scope.tenantId, turn.id))
    }, 'task')
  }

  async *resubscribe(params: SubscribeToTaskRequest): AsyncGenerator<StreamResponse, void, undefined> {
    const { sessions } = this.services
    const turn = await translated(() => this.ownTurn(params.id), 'task')
    yield { payload: { $case: 'task', value: this.storedTask(turn) } }
    if (turn.status !== 'running') return
    const replay = await translated(
      () => sessions.replayTurn(this.scope.tenantId, turn.sessionId, turn.id, 0),
      'task',
    )
    if (!replay) return
    const stop = new AbortController()
    try {
      yield* this.follow({ turnId: turn.id, sessionId: turn.sessionId }, (send) =>
        replay.stream(({ event }) => send(event), stop.signal),
      )
    } finally {
      stop.abort()
    }
  }

  async listTasks(): Promise<never> {
    throw unsupported('ListTasks')
  }

  async createTaskPushNotificationConfig(): Promise<never> {
    throw noPush()
  }

  async getTaskPushNotificationConfig(): Promise<never> {
    throw noPush()
  }

  async listTaskPushNotificationConfigs(): Promise<never> {
    throw noPush()
  }

  async deleteTaskPushNotificationConfig(): Promise<never> {
    throw noPush()
  }

  /**
   * Validates the message and begins its turn, in the context's session or a new one: the same
   * checks and lock as the native `POST /v1/sessions/{id}/messages`, before anything is answered.
   */
  private async begin(params: SendMessageRequest) {
    const message = params.message
    if (!message) throw malformed('message is required')
    if (message.taskId)
      throw unsupported(
        'a task is one turn and takes no further message: send the next message in the same contextId, without taskId',
      )
    const prompt = promptOf(message.parts)
    const { sessions } = this.services
    const { tenantId, agent } = this.scope
    if (message.contextId) {
      const sessionId = await this.contextSession(message.contextId)
      return this.beginIn(sessionId, prompt)
    }
    // A new context: a turn that cannot begin (the tenant's sandboxes all busy …) takes its
    // session with it, so a client retrying a refused message does not pile up sessions.
    const created = await sessions.create(tenantId, { agent: agent.id })
    try {
      return await this.beginIn(created.id, prompt)
    } catch (error) {
      await sessions.delete(tenantId, created.id).catch((e: unknown) => {
        this.services.logger.warn({ err: e, sessionId: created.id }, 'a2a: a new context was not deleted')
      })
      throw error
    }
  }

  private async beginIn(sessionId: string, prompt: string) {
    const { sessions } = this.services
    const handle = await sessions.startTurn(this.scope.tenantId, sessionId, prompt)
    const ref: TurnRef = { turnId: handle.turnId, sessionId }
    return { ref, prompt, run: (emit: TurnEmit) => handle.run(emit) }
  }

  /** A context named by the client: one of this agent's sessions, in the key's tenant. */
  private async contextSession(contextId: string): Promise<string> {
    const info = await this.services.sessions.get(this.scope.tenantId, contextId)
    if (info.agentId !== this.scope.agent.id)
      throw malformed(
        `context ${contextId} is a session of agent ${info.agentName}, not of ${this.scope.agent.name}`,
      )
    return info.id
  }

  /** A turn of this agent's sessions in the key's tenant; any other is not found, as none is. */
  private async ownTurn(turnId: string): Promise<StoredTurn> {
    const turn = await this.services.sessions.turn(this.scope.tenantId, turnId)
    const session = await this.services.sessions.get(this.scope.tenantId, turn.sessionId)
    if (session.agentId !== this.scope.agent.id) throw new CairnProblem('not_found', `No turn '${turnId}'`)
    return turn
  }

  /** The turn's events as stream responses, then (when it completed) the files it changed. */
  private async *follow(
    ref: TurnRef,
    run: (emit: TurnEmit) => Promise<void>,
  ): AsyncGenerator<StreamResponse, void, undefined> {
    const pipe = new EventPipe<StreamEvent>()
    run((event) => pipe.push(event)).then(
      () => pipe.end(),
      (error: unknown) => pipe.end(toA2AError(error, 'params')),
    )
    const mapper = new TaskEventMapper(ref)
    let seq = 0
    for await (const event of pipe) {
      if (event.type === 'run.started') seq = event.turn
      yield* mapper.map(event)
      if (event.type !== 'run.completed') continue
      const files = await this.changedFiles(ref, seq)
      if (files) yield artifactUpdate(ref, files, false, true)
      yield mapper.completed()
    }
  }

  private openTask(ref: TurnRef, prompt: string): Task {
    const asked = turnMessage(ref, 'user', [textPart(prompt)], `${ref.turnId}-prompt`)
    return task(ref, status(taskState('running')), [], [asked], { cairn: { sessionId: ref.sessionId } })
  }

  /** A task as the turn's row has it now; `files` adds what the turn changed. */
  private storedTask(turn: StoredTurn, files?: Artifact): Task {
    const ref: TurnRef = { turnId: turn.id, sessionId: turn.sessionId }
    const answer = turn.error?.message ?? turn.response
    const replied =
      answer === '' ? undefined : turnMessage(ref, 'agent', [textPart(answer)], `${ref.turnId}-reply`)
    const asked = turnMessage(ref, 'user', [textPart(turn.prompt)], `${ref.turnId}-prompt`)
    const artifacts = [
      ...(turn.response === '' ? [] : [replyArtifact(ref, turn.response)]),
      ...(files ? [files] : []),
    ]
    return task(
      ref,
      status(taskState(turn.status), replied),
      artifacts,
      replied ? [asked, replied] : [asked],
      {
        cairn: {
          sessionId: turn.sessionId,
          turn: turn.seq,
          durationMs: turn.durationMs,
          ...(turn.error ? { code: turn.error.code } : {}),
        },
      },
    )
  }

  /**
   * What the turn changed in /workspace, against the snapshot taken before it; undefined when
   * there is no such snapshot (automatic snapshots off), nothing changed, or the diff failed (the
   * task's answer does not wait on it: it is logged).
   */
  private async changedFiles(ref: TurnRef, seq: number): Promise<Artifact | undefined> {
    const { workspace, logger } = this.services
    try {
      const before = await workspace.snapshots.atTurn(ref.sessionId, seq - 1)
      if (!before) return undefined
      const diff = await workspace.files.diff(this.scope.tenantId, ref.sessionId, before.id)
      if (diff.added.length + diff.changed.length + diff.deleted.length === 0 && !diff.truncated)
        return undefined
      return filesArtifact(ref, diff, this.scope.baseUrl)
    } catch (error) {
      logger.warn({ err: error, turnId: ref.turnId }, 'a2a: the files the turn changed could not be listed')
      return undefined
    }
  }
}

/** The text of a message's parts: the prompt of the turn. */
function promptOf(parts: Part[]): string {
  const texts: string[] = []
  for (const [index, part] of parts.entries()) {
    if (part.content?.$case !== 'text')
      throw malformed(
        `message.parts[${index}] is a ${part.content?.$case ?? 'empty'} part: a Cairn agent takes text parts only (put a file in its workspace with the files API)`,
      )
    texts.push(part.content.value)
  }
  const prompt = texts.join('\n')
  if (prompt.trim() === '') throw malformed('the message has no text')
  if (Buffer.byteLength(prompt) > MAX_PROMPT_BYTES)
    throw malformed(`the message's text is over ${MAX_PROMPT_BYTES} bytes`)
  return prompt
}

const malformed = (message: string) =>
  new RequestMalformedError({ message, metadata: { code: 'validation_failed' } })
const unsupported = (what: string) =>
  new UnsupportedOperationError({
    message: `${what} is not supported by Cairn's A2A server`,
    metadata: { code: 'bad_request' },
  })
const noPush = () =>
  new PushNotificationNotSupportedError({
    message:
      'push notifications are not supported: stream the task (SendStreamingMessage) or poll it (GetTask)',
    metadata: { code: 'bad_request' },
  })

/**
 * Cairn's typed errors as A2A's: the registry code rides in the error's metadata (`code`); a
 * missing task is `TaskNotFoundError`, any other refusal of the request `RequestMalformedError`
 * (JSON-RPC -32602), a server fault an internal error with its code.
 */
export function toA2AError(error: unknown, missing: 'task' | 'params'): unknown {
  if (!(error instanceof CairnProblem)) return error
  const options = { message: error.message, metadata: { code: error.code } }
  if (error.status === 404 && missing === 'task') return new TaskNotFoundError(options)
  if (error.status >= 500) return new A2AError(options)
  return new RequestMalformedError(options)
}

async function translated<T>(work: () => Promise<T>, missing: 'task' | 'params'): Promise<T> {
  try {
    return await work()
  } catch (error) {
    throw toA2AError(error, missing)
  }
}
