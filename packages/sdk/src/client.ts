import type { SandboxDriver, Usage } from '@cairn/protocol'
import { Agents } from './agents.js'
import { readEnv } from './env.js'
import { CairnError, ValidationError } from './errors.js'
import { checked } from './guards.js'
import { type FetchLike, HttpClient, type RequestOptions } from './http.js'
import { Images } from './images.js'
import { Keys } from './keys.js'
import { Nodes } from './nodes.js'
import { assertKnownOptions } from './options.js'
import { Secrets } from './secrets.js'
import { CREATE_SESSION_OPTION_KEYS, type CreateSessionOptions, type Session, Sessions } from './sessions.js'
import { AgentStream, type ReconnectOptions, type RunResult } from './stream.js'
import * as valid from './validators.js'
import { Webhooks } from './webhooks.js'

export const DEFAULT_BASE_URL = 'http://127.0.0.1:7070'
export const DEFAULT_TIMEOUT_MS = 60_000

export interface CairnOptions {
  /** Defaults to `CAIRN_API_KEY`. */
  apiKey?: string | undefined
  /** Defaults to `CAIRN_API_URL`, then `http://127.0.0.1:7070`. */
  baseUrl?: string | undefined
  /** Per request; for streams, until the answer starts. Default 60 s. */
  timeoutMs?: number | undefined
  /** A `fetch` to use instead of the global one. */
  fetch?: FetchLike | undefined
  /** Sent as User-Agent where the platform allows it. */
  userAgent?: string | undefined
}

export interface RunOptions extends CreateSessionOptions, ReconnectOptions {
  message: string
  /**
   * Run in this existing session (full ID); without it a fresh session is created for this one
   * message and ended afterwards (the stateless pattern: each call is independent). The options of
   * a new session (`title`, `idleTimeout`, …) are refused alongside it.
   */
  sessionId?: string | undefined
}

const RUN_OPTION_KEYS = [
  'message',
  'sessionId',
  'maxReconnects',
  'onReconnect',
  ...CREATE_SESSION_OPTION_KEYS,
] as const

/** The Cairn API client. Core code: fetch, streams and text decoding only, so it runs in browsers too. */
export class Cairn {
  readonly agents: Agents
  readonly sessions: Sessions
  readonly secrets: Secrets
  /** API keys of the caller's tenant (admin keys only). */
  readonly keys: Keys
  /** Built agent images, with the caller's revisions that use each. */
  readonly images: Images
  /** The cluster's runtime nodes (install admin keys only). */
  readonly nodes: Nodes
  /** Webhook endpoints for lifecycle events, and their delivery logs. */
  readonly webhooks: Webhooks
  readonly baseUrl: string
  private readonly http: HttpClient

  constructor(options: CairnOptions = {}) {
    this.baseUrl = (options.baseUrl ?? readEnv('CAIRN_API_URL') ?? DEFAULT_BASE_URL).replace(/\/+$/, '')
    const fetchImpl = options.fetch ?? globalThis.fetch?.bind(globalThis)
    if (!fetchImpl) {
      throw new CairnError({ code: 'bad_request', message: 'no fetch available: pass one as `fetch`' })
    }
    this.http = new HttpClient({
      baseUrl: this.baseUrl,
      apiKey: options.apiKey ?? readEnv('CAIRN_API_KEY'),
      timeoutMs: options.timeoutMs ?? DEFAULT_TIMEOUT_MS,
      fetch: fetchImpl,
      userAgent: options.userAgent,
    })
    this.agents = new Agents(this.http)
    this.sessions = new Sessions(this.http)
    this.secrets = new Secrets(this.http)
    this.keys = new Keys(this.http)
    this.images = new Images(this.http)
    this.nodes = new Nodes(this.http)
    this.webhooks = new Webhooks(this.http)
  }

  /** `GET /healthz` (no key needed). */
  async health(options: RequestOptions = {}): Promise<{ ok: boolean; version: string }> {
    const body = (await this.http.json({ method: 'GET', path: '/healthz', ...options })) as Record<
      string,
      unknown
    >
    return { ok: body?.ok === true, version: typeof body?.version === 'string' ? body.version : 'unknown' }
  }

  /**
   * `GET /v1/usage`: the tenant's sessions, snapshots, storage against its quota and what retention
   * freed (per layer); with `storage: true`, the bytes of its 100 most recently active sessions.
   */
  async usage(options: RequestOptions & { storage?: boolean | undefined } = {}): Promise<Usage> {
    const { storage, ...request } = options
    const query = storage ? { storage: 'true' } : undefined
    const body = await this.http.json({ method: 'GET', path: '/v1/usage', query, ...request })
    return checked(valid.Usage, body, 'usage report')
  }

  /**
   * `GET /v1/runtime`'s sandbox drivers: which run on this node (the one new sessions default to)
   * and what each can do (`capabilities.memorySnapshot`: checkpoints, so pause across a restart and
   * fork with memory; `residentPause`: a paused sandbox frozen in place in RAM), with the reasons
   * for what one cannot.
   */
  async drivers(options: RequestOptions = {}): Promise<SandboxDriver[]> {
    const body = await this.http.json({ method: 'GET', path: '/v1/runtime', ...options })
    return checked(valid.RuntimeDrivers, body, 'runtime description').drivers
  }

  createSession(agent: string, options: CreateSessionOptions = {}): Promise<Session> {
    return this.sessions.create(agent, options)
  }

  /** One turn. Without `sessionId` it runs in a new session that is ended afterwards. */
  async run(agent: string, options: RunOptions): Promise<RunResult> {
    return await this.stream(agent, options).result
  }

  /** One turn, streamed. Without `sessionId` it runs in a new session that is ended when the run is over. */
  stream(agent: string, options: RunOptions): AgentStream {
    assertKnownOptions('run', options, RUN_OPTION_KEYS)
    const { message, sessionId, signal, timeoutMs, maxReconnects, onReconnect, ...create } = options
    if (typeof message !== 'string') {
      throw new ValidationError({ code: 'validation_failed', message: 'run: message must be a string' })
    }
    if (sessionId !== undefined) {
      // Options of a new session would be dropped here: say so instead.
      const dropped = Object.entries(create).find(([, value]) => value !== undefined)?.[0]
      if (dropped !== undefined) {
        throw new ValidationError({
          code: 'validation_failed',
          message: `run: '${dropped}' applies to a new session, not to an existing one (sessionId); change a session's policy with sessions.resume(id, { policy })`,
        })
      }
      return this.sessions.stream(sessionId, message, { signal, timeoutMs, maxReconnects, onReconnect })
    }
    let created: string | undefined
    return new AgentStream(
      {
        open: async (openSignal) => {
          const session = await this.sessions.create(agent, {
            ephemeral: true,
            keepTranscript: true,
            ...create,
            signal: openSignal,
            timeoutMs,
          })
          created = session.id
          return this.sessions.openRun(session.id, message, openSignal, timeoutMs)
        },
        resume: (turnId, after, resumeSignal) =>
          this.sessions.openTurnEvents(created ?? '', turnId, after, resumeSignal, timeoutMs),
        cancel: async () => {
          if (created !== undefined) await this.sessions.cancel(created)
        },
        finish: async () => {
          if (created !== undefined) await this.sessions.end(created)
        },
      },
      signal,
      { maxReconnects, onReconnect },
    )
  }
}
