import type {
  Message,
  SessionInfo,
  SessionStatus,
  SetupInfo,
  SnapshotInfo,
  StatusEvent,
  StreamEvent,
  TurnInfo,
} from '@cairn/protocol'
import { Approvals } from './approvals.js'
import { Commands } from './commands.js'
import { ConnectionError, InvalidResponseError } from './errors.js'
import { decodeEvent } from './events.js'
import { asCursor, asList, asMessage, asSession, asStatusEvent, asTurn, checked } from './guards.js'
import type { HttpClient, RequestOptions } from './http.js'
import { assertKnownOptions, idleTimeoutMsOf } from './options.js'
import {
  CREATE_SESSION_OPTION_KEYS,
  type CreateSessionOptions,
  type ListSessionsOptions,
  type PreviewUrl,
  type ResumeOptions,
  type SessionLease,
  type SessionPage,
  type StreamOptions,
} from './session-options.js'
import { readSse } from './sse.js'
import { AgentStream, type OpenedRun, type RunResult, type StreamDriver } from './stream.js'
import * as valid from './validators.js'
import { Files, Snapshots } from './workspace.js'

export {
  CREATE_SESSION_OPTION_KEYS,
  type CreateSessionOptions,
  type ListSessionsOptions,
  type PreviewUrl,
  type ResumeOptions,
  type SessionLease,
  type SessionPage,
  type StreamOptions,
} from './session-options.js'

const path = (id: string, rest = '') => `/v1/sessions/${encodeURIComponent(id)}${rest}`

/** A run's SSE body as events; `eventId()` is the SSE id of the event yielded last. */
function decodeEvents(body: ReadableStream<Uint8Array>): Pick<OpenedRun, 'events' | 'eventId'> {
  let current: number | undefined
  async function* events(): AsyncGenerator<StreamEvent> {
    for await (const message of readSse(body)) {
      const event = decodeEvent(message)
      if (event === undefined) continue
      const id = message.id === undefined ? Number.NaN : Number(message.id)
      current = Number.isSafeInteger(id) ? id : undefined
      yield event
    }
  }
  return { events: events(), eventId: () => current }
}

/** Session calls by ID. `Session` handles wrap these for one session. */
export class Sessions {
  constructor(private readonly http: HttpClient) {}

  /** The snapshots of a session (by full ID). */
  snapshots(id: string): Snapshots {
    return new Snapshots(this.http, id)
  }

  /** The workspace files of a session (by full ID). */
  files(id: string): Files {
    return new Files(this.http, id)
  }

  /** Commands in a session's sandbox outside turns (by full ID). */
  commands(id: string): Commands {
    return new Commands(this.http, id)
  }

  /** The approval requests of a session's agent (by full ID). */
  approvals(id: string): Approvals {
    return new Approvals(this.http, id)
  }

  /**
   * Revision, environment, snapshots, last turn, dirty files, limits and policies of a session.
   * `sizes: true` also measures the live workspace (`workspaceSizes`: referenced and exclusive bytes).
   */
  async manifest(
    id: string,
    options: RequestOptions & { sizes?: boolean | undefined } = {},
  ): Promise<Record<string, unknown>> {
    const { sizes, ...request } = options
    const body = await this.http.json({
      method: 'GET',
      path: path(id, '/manifest'),
      query: { sizes: sizes ? 'true' : undefined },
      ...request,
    })
    return checked(valid.SessionManifest, body, 'manifest')
  }

  async create(agent: string, options: CreateSessionOptions = {}): Promise<Session> {
    assertKnownOptions('createSession', options, CREATE_SESSION_OPTION_KEYS)
    const idleTimeoutMs = idleTimeoutMsOf('createSession', options)
    const {
      title,
      idleTimeout: _seconds,
      idleTimeoutMs: _milliseconds,
      keepWarmMs,
      policy,
      autoSnapshots,
      ephemeral,
      keepTranscript,
      setup,
      pause,
      ...request
    } = options
    const info = asSession(
      await this.http.json({
        method: 'POST',
        path: '/v1/sessions',
        json: {
          agent,
          title,
          idleTimeoutMs,
          keepWarmMs,
          policy,
          autoSnapshots,
          ephemeral,
          keepTranscript,
          setup,
          pause,
        },
        ...request,
      }),
    )
    return new Session(this, info)
  }

  /** A session by its full ID. */
  async get(id: string, options: RequestOptions = {}): Promise<Session> {
    return new Session(this, await this.info(id, options))
  }

  async info(id: string, options: RequestOptions = {}): Promise<SessionInfo> {
    return asSession(await this.http.json({ method: 'GET', path: path(id), ...options }))
  }

  /** A session by a unique prefix of its ID (with or without `ses_`); throws `AmbiguousIdError` or `SessionNotFoundError`. */
  async resolve(prefix: string, options: RequestOptions = {}): Promise<Session> {
    const info = asSession(
      await this.http.json({ method: 'GET', path: '/v1/sessions/resolve', query: { prefix }, ...options }),
    )
    return new Session(this, info)
  }

  /** One page of sessions, newest first. */
  async list(options: ListSessionsOptions = {}): Promise<SessionPage> {
    const { agent, status, limit, cursor, ...request } = options
    const body = await this.http.json({
      method: 'GET',
      path: '/v1/sessions',
      query: { agent, status, limit, cursor },
      ...request,
    })
    return { data: asList(body, asSession, 'session list'), nextCursor: asCursor(body) }
  }

  /** Every session, page after page. */
  async *listAll(options: Omit<ListSessionsOptions, 'cursor'> = {}): AsyncGenerator<SessionInfo> {
    let cursor: string | undefined
    do {
      const page = await this.list({ ...options, cursor })
      yield* page.data
      cursor = page.nextCursor
    } while (cursor !== undefined)
  }

  async delete(id: string, options: RequestOptions = {}): Promise<void> {
    await this.http.json({ method: 'DELETE', path: path(id), ...options })
  }

  /** Ends the session (status `completed`); its workspace and transcript stay and it can be resumed. */
  async end(id: string, options: RequestOptions = {}): Promise<SessionInfo> {
    return asSession(await this.http.json({ method: 'POST', path: path(id, '/end'), ...options }))
  }

  /** Resumes an ended, failed or timed-out session; `policy` changes its lifecycle policy first. */
  async resume(id: string, options: ResumeOptions = {}): Promise<SessionInfo> {
    const { policy, ...request } = options
    return asSession(
      await this.http.json({
        method: 'POST',
        path: path(id, '/resume'),
        ...(policy === undefined ? {} : { json: { policy } }),
        ...request,
      }),
    )
  }

  /**
   * Holds the session active for `ttlMs` (1 s to 24 h) from now: no idle timeout, and a warm sandbox
   * stays warm at least that long. Call it again to extend; it replaces the previous lease.
   */
  async lease(id: string, ttlMs: number, options: RequestOptions = {}): Promise<SessionLease> {
    const body = await this.http.json({
      method: 'POST',
      path: path(id, '/lease'),
      json: { ttlMs },
      ...options,
    })
    const { sessionId, leaseUntil } = checked(valid.SessionLease, body, 'lease')
    return { sessionId, leaseUntil }
  }

  /**
   * A signed URL (valid `ttlMs`, default 1 h) to the service listening on `port` inside the
   * session's running sandbox; anyone holding it reaches that port of that session until it expires.
   * The URL is on that session port's own origin (the server's preview listener), not the API's.
   */
  async previewUrl(
    id: string,
    port: number,
    options: RequestOptions & { ttlMs?: number | undefined } = {},
  ): Promise<PreviewUrl> {
    const { ttlMs, ...rest } = options
    const body = await this.http.json({
      method: 'POST',
      path: path(id, `/ports/${port}/url`),
      json: ttlMs === undefined ? {} : { ttlMs },
      ...rest,
    })
    const { url, expiresAt } = checked(valid.PreviewUrl, body, 'preview URL')
    return { url, expiresAt }
  }

  /**
   * Revokes every signed URL issued so far for `port` of the session (and the cookies they left);
   * URLs asked for afterwards work. Ending or deleting a session revokes all of its URLs.
   */
  async revokePreviewUrls(id: string, port: number, options: RequestOptions = {}): Promise<void> {
    await this.http.json({ method: 'DELETE', path: path(id, `/ports/${port}/url`), ...options })
  }

  /** The session's setup phase (status, attempts, exit code, log tail); `NotFoundError` without one. */
  async setup(id: string, options: RequestOptions = {}): Promise<SetupInfo> {
    const body = await this.http.json({ method: 'GET', path: path(id, '/setup'), ...options })
    return checked(valid.SetupInfo, body, 'setup')
  }

  /** The whole log of the latest setup run (secrets redacted). */
  async setupLog(id: string, options: RequestOptions = {}): Promise<string> {
    const { response, done } = await this.http.stream({
      method: 'GET',
      path: path(id, '/setup/log'),
      accept: 'text/plain',
      ...options,
    })
    try {
      return await response.text()
    } finally {
      done()
    }
  }

  /** Cancels the running turn; `false` when none was running. */
  async cancel(id: string, options: RequestOptions = {}): Promise<boolean> {
    const body = await this.http.json({ method: 'POST', path: path(id, '/cancel'), ...options })
    return typeof body === 'object' && body !== null && (body as { ok?: unknown }).ok === true
  }

  /** The transcript. */
  async messages(id: string, options: RequestOptions = {}): Promise<Message[]> {
    return asList(
      await this.http.json({ method: 'GET', path: path(id, '/messages'), ...options }),
      asMessage,
      'message list',
    )
  }

  /** Every status change with its cause. */
  async events(id: string, options: RequestOptions = {}): Promise<StatusEvent[]> {
    return asList(
      await this.http.json({ method: 'GET', path: path(id, '/events'), ...options }),
      asStatusEvent,
      'event list',
    )
  }

  /** Turns with their status, timing and the tail of the agent's stderr. */
  async turns(id: string, options: RequestOptions = {}): Promise<TurnInfo[]> {
    return asList(
      await this.http.json({ method: 'GET', path: path(id, '/turns'), ...options }),
      asTurn,
      'turn list',
    )
  }

  /**
   * Sends a message and streams the run. A connection that drops before the run's end is picked
   * up again after the last event received (`maxReconnects`, `onReconnect`).
   */
  stream(id: string, message: string, options: StreamOptions = {}): AgentStream {
    const { maxReconnects, onReconnect } = options
    return new AgentStream(
      {
        open: (signal) => this.openRun(id, message, signal, options.timeoutMs),
        resume: (turnId, after, signal) => this.openTurnEvents(id, turnId, after, signal, options.timeoutMs),
        cancel: async () => {
          await this.cancel(id)
        },
      },
      options.signal,
      { maxReconnects, onReconnect },
    )
  }

  run(id: string, message: string, options: StreamOptions = {}): Promise<RunResult> {
    return this.stream(id, message, options).result
  }

  /** @internal Opens the SSE answer of one message. */
  async openRun(
    id: string,
    message: string,
    signal: AbortSignal,
    timeoutMs?: number,
  ): ReturnType<StreamDriver['open']> {
    const { response, abort, done } = await this.http.stream({
      method: 'POST',
      path: path(id, '/messages'),
      json: { prompt: message },
      accept: 'text/event-stream',
      signal,
      timeoutMs,
    })
    if (!response.body) {
      done()
      throw new InvalidResponseError({ code: 'invalid_response', message: 'the run answered without a body' })
    }
    return {
      sessionId: id,
      turnId: response.headers.get('cairn-turn-id') ?? undefined,
      ...decodeEvents(response.body),
      close: () => {
        abort()
        done()
      },
    }
  }

  /**
   * @internal A turn's stream picked up after event `after` (`GET …/turns/{turnId}/events`). A
   * turn that ended with its last event at or before `after` answers 204: nothing more comes.
   */
  async openTurnEvents(
    id: string,
    turnId: string,
    after: number,
    signal: AbortSignal,
    timeoutMs?: number,
  ): Promise<OpenedRun> {
    const { response, abort, done } = await this.http.stream({
      method: 'GET',
      path: path(id, `/turns/${encodeURIComponent(turnId)}/events`),
      query: { after },
      accept: 'text/event-stream',
      signal,
      timeoutMs,
    })
    if (response.status === 204 || !response.body) {
      done()
      throw new ConnectionError({
        code: 'connection_error',
        message: `turn ${turnId} ended, but its last events did not arrive before the connection dropped`,
        retryable: false,
      })
    }
    return {
      sessionId: id,
      turnId,
      ...decodeEvents(response.body),
      close: () => {
        abort()
        done()
      },
    }
  }
}

/** A handle on one session: what you created, you run, end, resume or delete through it. */
export class Session {
  constructor(
    private readonly sessions: Sessions,
    /** The latest state seen; refreshed by `refresh()`, `end()` and `resume()`. */
    public info: SessionInfo,
  ) {}

  get id(): string {
    return this.info.id
  }
  /** Snapshots of the workspace: create, list, restore, undo, fork. */
  get snapshots(): Snapshots {
    return this.sessions.snapshots(this.id)
  }
  /** Files of the workspace: list, read, write, delete, diff, export. */
  get files(): Files {
    return this.sessions.files(this.id)
  }
  /** Commands in the sandbox outside turns: start, output by offset, stdin, signal, run. */
  get commands(): Commands {
    return this.sessions.commands(this.id)
  }
  /** The agent's approval requests: list, get, approve, deny. */
  get approvals(): Approvals {
    return this.sessions.approvals(this.id)
  }
  get agentName(): string {
    return this.info.agentName
  }
  get status(): SessionStatus {
    return this.info.status
  }
  get title(): string | undefined {
    return this.info.title ?? undefined
  }

  run(message: string, options: StreamOptions = {}): Promise<RunResult> {
    return this.sessions.run(this.id, message, options)
  }

  /**
   * Forks of this session as it is now (see `Snapshots.forks`): `fork({ memory: true, count: 3 })`
   * gives three sessions whose processes go on from this instant, each with its own workspace.
   */
  async fork(
    options: Parameters<Snapshots['forks']>[0] = {},
  ): Promise<{ snapshot: SnapshotInfo; memory: boolean; sessions: Session[] }> {
    const result = await this.snapshots.forks(options)
    return { ...result, sessions: result.sessions.map((info) => new Session(this.sessions, info)) }
  }

  stream(message: string, options: StreamOptions = {}): AgentStream {
    return this.sessions.stream(this.id, message, options)
  }

  messages(options: RequestOptions = {}): Promise<Message[]> {
    return this.sessions.messages(this.id, options)
  }

  events(options: RequestOptions = {}): Promise<StatusEvent[]> {
    return this.sessions.events(this.id, options)
  }

  turns(options: RequestOptions = {}): Promise<TurnInfo[]> {
    return this.sessions.turns(this.id, options)
  }

  cancel(options: RequestOptions = {}): Promise<boolean> {
    return this.sessions.cancel(this.id, options)
  }

  /** Holds the session active for `ttlMs`; see `Sessions.lease`. */
  lease(ttlMs: number, options: RequestOptions = {}): Promise<SessionLease> {
    return this.sessions.lease(this.id, ttlMs, options)
  }

  /** The setup phase; see `Sessions.setup`. */
  setup(options: RequestOptions = {}): Promise<SetupInfo> {
    return this.sessions.setup(this.id, options)
  }

  setupLog(options: RequestOptions = {}): Promise<string> {
    return this.sessions.setupLog(this.id, options)
  }

  /** A signed URL to a service on `port` inside the sandbox; see `Sessions.previewUrl`. */
  previewUrl(
    port: number,
    options: RequestOptions & { ttlMs?: number | undefined } = {},
  ): Promise<PreviewUrl> {
    return this.sessions.previewUrl(this.id, port, options)
  }

  /** Revokes the signed URLs issued so far for `port`; see `Sessions.revokePreviewUrls`. */
  revokePreviewUrls(port: number, options: RequestOptions = {}): Promise<void> {
    return this.sessions.revokePreviewUrls(this.id, port, options)
  }

  manifest(options: RequestOptions & { sizes?: boolean | undefined } = {}): Promise<Record<string, unknown>> {
    return this.sessions.manifest(this.id, options)
  }

  async refresh(options: RequestOptions = {}): Promise<SessionInfo> {
    this.info = await this.sessions.info(this.id, options)
    return this.info
  }

  async end(options: RequestOptions = {}): Promise<SessionInfo> {
    this.info = await this.sessions.end(this.id, options)
    return this.info
  }

  async resume(options: ResumeOptions = {}): Promise<SessionInfo> {
    this.info = await this.sessions.resume(this.id, options)
    return this.info
  }

  delete(options: RequestOptions = {}): Promise<void> {
    return this.sessions.delete(this.id, options)
  }

  toJSON(): SessionInfo {
    return this.info
  }
}
