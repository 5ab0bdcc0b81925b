import { ERROR_CODES, type ErrorCode, isErrorCode } from '@cairn/protocol/core'

/** Codes the client produces itself, for failures that never reached (or never came back from) the server. */
export type ClientErrorCode = 'connection_error' | 'aborted' | 'invalid_response'
/** A registry code, a client code, or a code from a newer server this SDK does not know yet. */
export type CairnErrorCode = ErrorCode | ClientErrorCode | (string & Record<never, never>)

export interface CairnErrorInit {
  code: CairnErrorCode
  message: string
  status?: number | undefined
  requestId?: string | undefined
  retryable?: boolean | undefined
  details?: Record<string, unknown> | undefined
  cause?: unknown
}

/** Every error the SDK throws. `code` is a protocol registry code or one of the client's own codes. */
export class CairnError extends Error {
  readonly code: CairnErrorCode
  /** HTTP status, when the server answered. */
  readonly status: number | undefined
  readonly requestId: string | undefined
  readonly retryable: boolean
  readonly details: Record<string, unknown> | undefined

  constructor(init: CairnErrorInit) {
    super(init.message, init.cause === undefined ? undefined : { cause: init.cause })
    this.name = new.target.name
    this.code = init.code
    this.status = init.status
    this.requestId = init.requestId
    this.details = init.details
    this.retryable = init.retryable ?? (isErrorCode(init.code) ? ERROR_CODES[init.code].retryable : false)
  }
}

export class AuthenticationError extends CairnError {}
export class PermissionDeniedError extends CairnError {}
export class ValidationError extends CairnError {}
export class PayloadTooLargeError extends CairnError {}
export class NotFoundError extends CairnError {}
export class AgentNotFoundError extends NotFoundError {}
export class SessionNotFoundError extends NotFoundError {}
export class SessionDeletedError extends NotFoundError {}
export class ConflictError extends CairnError {}
export class SessionBusyError extends ConflictError {}
export class SessionNotResumableError extends ConflictError {}
export class AgentNotReadyError extends ConflictError {}
/** The session reached its policy's `maxTurns` (details: `maxTurns`, `turnCount`). */
export class TurnLimitReachedError extends ConflictError {}
/** The session ran past its policy's `maxDurationMs` (details: `maxDurationMs`, `deadlineAt`). */
export class DurationLimitReachedError extends ConflictError {}
/** The agent declares secrets that are not set yet; `missing` names them. */
export class SecretsMissingError extends ConflictError {
  get missing(): string[] {
    const missing = this.details?.missing
    return Array.isArray(missing) ? missing.filter((m): m is string => typeof m === 'string') : []
  }
}
/** The revision's dependencies or setup command failed to build. */
export class BuildFailedError extends CairnError {}
export class RateLimitError extends CairnError {}
export class AgentCrashedError extends CairnError {}
export class AgentProtocolError extends CairnError {}
export class SandboxError extends CairnError {}
export class LimitExceededError extends CairnError {}
/** A workspace or tenant storage quota is used up: free space (delete files or snapshots) first. */
export class QuotaExceededError extends CairnError {}
export class InternalServerError extends CairnError {}
export class ServiceUnavailableError extends CairnError {}

/** A prefix matched several IDs; `matches` lists them. */
export class AmbiguousIdError extends ConflictError {
  get matches(): string[] {
    const matches = this.details?.matches
    return Array.isArray(matches) ? matches.filter((m): m is string => typeof m === 'string') : []
  }
}

/** The server timed out (`timeout` code) or the request took longer than `timeoutMs`. */
export class TimeoutError extends CairnError {}
/** The server could not be reached, or the connection broke. */
export class ConnectionError extends CairnError {}
/** The call was aborted through its `signal` (or `AgentStream.abort()`). */
export class AbortError extends CairnError {}
/** The server answered something the SDK cannot read. */
export class InvalidResponseError extends CairnError {}

type ErrorClass = new (init: CairnErrorInit) => CairnError

/** One class per registry code; the Record type makes the compiler refuse a missing code. */
const CLASS_BY_CODE: Record<ErrorCode, ErrorClass> = {
  bad_request: ValidationError,
  validation_failed: ValidationError,
  invalid_json: ValidationError,
  invalid_archive: ValidationError,
  invalid_manifest: ValidationError,
  capability_unavailable: ValidationError,
  limit_above_ceiling: ValidationError,
  unsupported_media_type: ValidationError,
  method_not_allowed: ValidationError,
  unauthorized: AuthenticationError,
  forbidden: PermissionDeniedError,
  not_found: NotFoundError,
  agent_not_found: AgentNotFoundError,
  webhook_not_found: NotFoundError,
  approval_not_found: NotFoundError,
  approval_answered: ConflictError,
  approval_expired: ConflictError,
  webhook_url_forbidden: ValidationError,
  webhook_limit_reached: ConflictError,
  revision_not_found: NotFoundError,
  command_not_found: NotFoundError,
  session_not_found: SessionNotFoundError,
  session_deleted: SessionDeletedError,
  ambiguous_id: AmbiguousIdError,
  session_busy: SessionBusyError,
  session_not_resumable: SessionNotResumableError,
  turn_limit_reached: TurnLimitReachedError,
  duration_limit_reached: DurationLimitReachedError,
  agent_not_ready: AgentNotReadyError,
  conflict: ConflictError,
  snapshot_in_use: ConflictError,
  merge_base_missing: ConflictError,
  snapshot_left_behind: ConflictError,
  secrets_missing: SecretsMissingError,
  sandbox_not_running: ConflictError,
  port_not_listening: ConflictError,
  build_failed: BuildFailedError,
  image_too_large: BuildFailedError,
  setup_failed: BuildFailedError,
  resume_failed: BuildFailedError,
  payload_too_large: PayloadTooLargeError,
  headers_too_large: PayloadTooLargeError,
  quota_exceeded: QuotaExceededError,
  images_quota_exceeded: QuotaExceededError,
  rate_limited: RateLimitError,
  sandbox_limit_reached: RateLimitError,
  snapshot_limit_reached: ConflictError,
  key_limit_reached: ConflictError,
  image_limit_reached: ConflictError,
  agent_crashed: AgentCrashedError,
  agent_protocol_error: AgentProtocolError,
  port_unreachable: SandboxError,
  sandbox_failed: SandboxError,
  limit_exceeded: LimitExceededError,
  storage_error: InternalServerError,
  shipping_failed: ServiceUnavailableError,
  shipping_conflict: ConflictError,
  chain_invalid: InternalServerError,
  state_lost: InternalServerError,
  internal: InternalServerError,
  unavailable: ServiceUnavailableError,
  session_elsewhere: ServiceUnavailableError,
  node_unavailable: ServiceUnavailableError,
  node_fenced: ServiceUnavailableError,
  stale_epoch: ConflictError,
  node_lost: ServiceUnavailableError,
  session_moving: SessionBusyError,
  replica_lost: ServiceUnavailableError,
  replica_stopping: ServiceUnavailableError,
  timeout: TimeoutError,
  request_timeout: TimeoutError,
}

/** The code a bare HTTP status stands for, when the body carries none (a proxy's HTML page, say). */
export function codeForStatus(status: number): ErrorCode {
  switch (status) {
    case 400:
      return 'bad_request'
    case 401:
      return 'unauthorized'
    case 403:
      return 'forbidden'
    case 404:
      return 'not_found'
    case 405:
      return 'method_not_allowed'
    case 408:
      return 'request_timeout'
    case 409:
      return 'conflict'
    case 410:
      return 'session_deleted'
    case 413:
      return 'payload_too_large'
    case 422:
      return 'build_failed'
    case 415:
      return 'unsupported_media_type'
    case 431:
      return 'headers_too_large'
    case 429:
      return 'rate_limited'
    case 503:
      return 'unavailable'
    case 504:
      return 'timeout'
    default:
      return status >= 500 ? 'internal' : 'bad_request'
  }
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
}

/** Builds the typed error for a code; unknown codes (a newer server) give a plain `CairnError`. */
export function errorFromCode(init: CairnErrorInit): CairnError {
  const Class = isErrorCode(init.code) ? CLASS_BY_CODE[init.code] : CairnError
  return new Class(init)
}

/** Reads `{ error: { code, message, requestId, details } }`, whatever the body holds. */
export function errorFromBody(status: number | undefined, body: unknown, requestId?: string): CairnError {
  const error = isRecord(body) && isRecord(body.error) ? body.error : undefined
  const code =
    typeof error?.code === 'string' ? error.code : status === undefined ? 'internal' : codeForStatus(status)
  const message =
    typeof error?.message === 'string'
      ? error.message
      : `request failed${status ? ` with HTTP ${status}` : ''}`
  return errorFromCode({
    code,
    message,
    status,
    requestId: typeof error?.requestId === 'string' ? error.requestId : requestId,
    details: isRecord(error?.details) ? error.details : undefined,
  })
}
