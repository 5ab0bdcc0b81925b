import type {
  PausePolicy,
  SessionInfo,
  SessionPolicyInput,
  SessionSetup,
  SessionStatus,
} from '@cairn/protocol'
import type { RequestOptions } from './http.js'
import { REQUEST_OPTION_KEYS } from './options.js'
import type { ReconnectOptions } from './stream.js'

// What the calls of `client.sessions` and a `Session` take and answer beside the protocol's
// types: options, a lease, a preview URL, a page of sessions.

export interface CreateSessionOptions extends RequestOptions {
  title?: string | undefined
  /**
   * Idle this many **seconds** → status `timeout` (the sandbox stops, the workspace stays): `3600`
   * is an hour. The same as `idleTimeoutMs` in seconds; give one of the two.
   */
  idleTimeout?: number | undefined
  idleTimeoutMs?: number | undefined
  keepWarmMs?: number | undefined
  /**
   * The lifecycle policy (`idleTimeoutMs`, `keepWarmMs`, `maxTurns`, `maxDurationMs`, `onTimeout`);
   * what is left out takes the server's default. The policy in force is `session.info.policy`.
   */
  policy?: SessionPolicyInput | undefined
  /** Snapshot the workspace after every turn so that it can be undone (default `true`). */
  autoSnapshots?: boolean | undefined
  /** Delete the workspace and its snapshots when the session ends (the default for `client.run`). */
  ephemeral?: boolean | undefined
  /** With `ephemeral`, keep the transcript after the end (default `false`). */
  keepTranscript?: boolean | undefined
  /**
   * A setup phase run before the first turn (`{ command, env?, network?, timeoutMs? }`), with the
   * agent's `setup`-scoped secrets; overrides `session.setup` of cairn.yaml.
   */
  setup?: SessionSetup | undefined
  /**
   * What the sandbox becomes when keep-warm ends, over the agent's cairn.yaml `pause`: `'memory'`
   * (checkpointed with its processes and memory, restored at the next message) or `'stop'`.
   */
  pause?: PausePolicy | undefined
}

export interface ResumeOptions extends RequestOptions {
  /** Fields to change in the session's lifecycle policy (the others stay as they are). */
  policy?: SessionPolicyInput | undefined
}

export interface ListSessionsOptions extends RequestOptions {
  /** Agent ID or name. */
  agent?: string | undefined
  status?: SessionStatus | undefined
  limit?: number | undefined
  cursor?: string | undefined
}

/** A lease: the session counts as active (no idle timeout, a warm sandbox stays warm) until `leaseUntil`. */
export interface SessionLease {
  sessionId: string
  /** ISO 8601. */
  leaseUntil: string
}

/** A signed URL to a service on a port inside the session's sandbox (a preview). */
export interface PreviewUrl {
  url: string
  /** ISO 8601. */
  expiresAt: string
}

export interface SessionPage {
  data: SessionInfo[]
  /** Pass as `cursor` for the next page; `undefined` on the last page. */
  nextCursor: string | undefined
}

/** Every key of `CreateSessionOptions`: any other is refused (see `assertKnownOptions`). */
export const CREATE_SESSION_OPTION_KEYS = [
  'title',
  'idleTimeout',
  'idleTimeoutMs',
  'keepWarmMs',
  'policy',
  'autoSnapshots',
  'ephemeral',
  'keepTranscript',
  'setup',
  'pause',
  ...REQUEST_OPTION_KEYS,
] as const satisfies ReadonlyArray<keyof CreateSessionOptions>
// A key added to CreateSessionOptions but not to the list above fails to compile here.
const everyCreateKeyListed: Exclude<
  keyof CreateSessionOptions,
  (typeof CREATE_SESSION_OPTION_KEYS)[number]
> extends never
  ? true
  : false = true
void everyCreateKeyListed

/** What `stream` and `run` take: the call's options and what to do when the stream drops. */
export interface StreamOptions extends RequestOptions, ReconnectOptions {}
