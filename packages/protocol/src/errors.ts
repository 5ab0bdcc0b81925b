/**
 * The error-code registry. Every error that crosses the wire carries one of these codes; the
 * `Record<ErrorCode, …>` below makes the compiler refuse a code without an HTTP status.
 */
export const ERROR_CODES = {
  bad_request: { status: 400, retryable: false },
  validation_failed: { status: 400, retryable: false },
  invalid_json: { status: 400, retryable: false },
  invalid_archive: { status: 400, retryable: false },
  invalid_manifest: { status: 400, retryable: false },
  /**
   * The agent's sandbox driver cannot do what was asked on this node (a fork with memory under
   * bwrap); details: driver, capability, reason (`GET /v1/runtime`'s capabilityReasons).
   */
  capability_unavailable: { status: 400, retryable: false },
  /** A limit asked for (cairn.yaml, a session) above the operator's maximum; details: limit, value, ceiling. */
  limit_above_ceiling: { status: 400, retryable: false },
  unauthorized: { status: 401, retryable: false },
  forbidden: { status: 403, retryable: false },
  not_found: { status: 404, retryable: false },
  /** The path is known but not with this method; the `Allow` header lists the methods it takes. */
  method_not_allowed: { status: 405, retryable: false },
  /** The client sent its request too slowly (the server's request timeout); nothing was done. */
  request_timeout: { status: 408, retryable: true },
  /** The request's headers are larger than the server reads (431); nothing was done. */
  headers_too_large: { status: 431, retryable: false },
  agent_not_found: { status: 404, retryable: false },
  webhook_not_found: { status: 404, retryable: false },
  /**
   * A webhook URL names (or resolves to) an address the server may not send to: loopback, a
   * private or link-local range, this host or the control plane, unless the operator allowed it
   * (--webhook-allow-cidr); details: url, address, reason.
   */
  webhook_url_forbidden: { status: 422, retryable: false },
  /** The tenant has as many webhook endpoints as it may (details.maxWebhooks): delete one first. */
  webhook_limit_reached: { status: 409, retryable: false },
  revision_not_found: { status: 404, retryable: false },
  session_not_found: { status: 404, retryable: false },
  /** No command with that id in the session (it never ran there, or its session was deleted). */
  command_not_found: { status: 404, retryable: false },
  /** No approval request with that id in the session. */
  approval_not_found: { status: 404, retryable: false },
  /** The approval request was answered already (details.status: approved or denied); the first answer stands. */
  approval_answered: { status: 409, retryable: false },
  /** The approval request expired unanswered (its session's approvalTimeoutMs; details.expiresAt). */
  approval_expired: { status: 409, retryable: false },
  ambiguous_id: { status: 409, retryable: false },
  session_busy: { status: 409, retryable: true },
  /**
   * The session lives on another API replica's runtime (named in details.runtimeId); send the
   * request there (until the cluster routes it itself).
   */
  session_elsewhere: { status: 421, retryable: true },
  session_not_resumable: { status: 409, retryable: false },
  session_deleted: { status: 410, retryable: false },
  turn_limit_reached: { status: 409, retryable: false },
  duration_limit_reached: { status: 409, retryable: false },
  agent_not_ready: { status: 409, retryable: true },
  conflict: { status: 409, retryable: false },
  /** A restore, fork or export is reading the snapshot; retry once it is done. */
  snapshot_in_use: { status: 409, retryable: true },
  /**
   * A merge needs the fork point: the session is not a fork, or the parent's snapshot it was
   * forked from is gone (deleted by hand or by retention); details: parentSessionId, snapshotId.
   */
  merge_base_missing: { status: 409, retryable: false },
  /**
   * The snapshot was taken before the session moved to another node (a move, a drain, a recovery
   * from the bucket), which carries the workspace and not the snapshots before it: they stay in
   * the old node's pool. details: snapshotId, movedAt, move (the move's event).
   */
  snapshot_left_behind: { status: 409, retryable: false },
  secrets_missing: { status: 409, retryable: false },
  sandbox_not_running: { status: 409, retryable: true },
  build_failed: { status: 422, retryable: false },
  /**
   * An agent image larger than the operator's maximum (--max-image-mib): its registry declares
   * more, or sent more while it was pulled (the pull is stopped at the cap); details: maxBytes.
   */
  image_too_large: { status: 422, retryable: false },
  /**
   * The shared images' group (--images-quota-mib) has no room for an image: its registry declares
   * more than is left, or the build or pull filled the group and was stopped (the revision FAILED);
   * details: quotaBytes, usedBytes. Retention removes images no revision uses.
   */
  images_quota_exceeded: { status: 507, retryable: false },
  /** The tenant's revisions run on as many distinct images as it may (--max-images-per-tenant); details: maxImages. */
  image_limit_reached: { status: 409, retryable: false },
  setup_failed: { status: 422, retryable: false },
  /** The agent's `session.resume` command failed before a cold start; it runs again on the next message. */
  resume_failed: { status: 422, retryable: false },
  payload_too_large: { status: 413, retryable: false },
  /** A workspace or tenant storage quota is used up (507 Insufficient Storage); only that session or tenant. */
  quota_exceeded: { status: 507, retryable: false },
  unsupported_media_type: { status: 415, retryable: false },
  rate_limited: { status: 429, retryable: true },
  /** The tenant has as many agent sandboxes running as it may, none idle to stop: retry later. */
  sandbox_limit_reached: { status: 429, retryable: true },
  /** The session or tenant keeps as many manual snapshots as it may: delete some first. */
  snapshot_limit_reached: { status: 409, retryable: false },
  /** The tenant holds as many active API keys as it may: revoke one first. */
  key_limit_reached: { status: 409, retryable: false },
  agent_crashed: { status: 500, retryable: true },
  agent_protocol_error: { status: 502, retryable: true },
  port_unreachable: { status: 502, retryable: true },
  /**
   * A signed URL was asked for a port nothing listens on inside the session's running sandbox
   * (it would only answer port_unreachable); details: port, listening (the ports that do).
   */
  port_not_listening: { status: 409, retryable: true },
  sandbox_failed: { status: 500, retryable: true },
  limit_exceeded: { status: 500, retryable: true },
  storage_error: { status: 500, retryable: true },
  /** The object store (the bucket workspaces ship to) could not be reached or refused a write; shipping retries. */
  shipping_failed: { status: 503, retryable: true },
  /** A key in the bucket already holds different bytes than this writer's (another writer, or tampering): never overwritten. */
  shipping_conflict: { status: 409, retryable: false },
  /** A shipped chain from the bucket was refused: a manifest or stream malformed, out of order, or not matching its digests. */
  chain_invalid: { status: 502, retryable: false },
  state_lost: { status: 500, retryable: false },
  internal: { status: 500, retryable: true },
  unavailable: { status: 503, retryable: true },
  /** The runtime node that holds the session could not be reached (down, partitioned, its link dropped). */
  node_unavailable: { status: 503, retryable: true },
  /** The node stopped serving: it could not renew its lease and fenced itself (its sandboxes are stopped). */
  node_fenced: { status: 503, retryable: true },
  /**
   * A runtime call made under an older owner epoch than the node has seen for the session: another
   * owner has taken it over since (cluster), so this caller's write changes nothing.
   */
  stale_epoch: { status: 409, retryable: false },
  /**
   * The session's node was declared lost (its lease ended or its process died); retry once it
   * registers again (or the session is moved to another node).
   */
  node_lost: { status: 503, retryable: true },
  /**
   * The session is being moved to another node (drain, rebalance, `cairn sessions move`): its
   * workspace is held while the last changes cross; retry in a moment (it is served by its new node).
   */
  session_moving: { status: 409, retryable: true },
  /**
   * The API replica relaying a turn died or could not renew its lease (cluster): the turn was
   * ended and its agent told to stop; the session takes messages again (through any replica).
   */
  replica_lost: { status: 503, retryable: true },
  /**
   * The API replica relaying a turn was asked to stop (SIGTERM, a rollout) and the turn outlasted
   * its shutdown grace: the turn was ended and its agent told to stop; send the message again.
   */
  replica_stopping: { status: 503, retryable: true },
  timeout: { status: 504, retryable: true },
} as const satisfies Record<string, { status: number; retryable: boolean }>

export type ErrorCode = keyof typeof ERROR_CODES

export const ERROR_STATUS: Record<ErrorCode, number> = Object.fromEntries(
  Object.entries(ERROR_CODES).map(([code, info]) => [code, info.status]),
) as Record<ErrorCode, number>

export function isErrorCode(value: unknown): value is ErrorCode {
  return typeof value === 'string' && Object.hasOwn(ERROR_CODES, value)
}

export function isRetryable(code: ErrorCode): boolean {
  return ERROR_CODES[code].retryable
}

/** Body of every error answer and of `run.failed` events. */
export interface ErrorBody {
  error: {
    code: ErrorCode
    message: string
    requestId?: string
    details?: Record<string, unknown>
  }
}

/** An error raised inside Cairn that knows its wire code. */
export class CairnProblem extends Error {
  readonly code: ErrorCode
  readonly details: Record<string, unknown> | undefined
  constructor(code: ErrorCode, message: string, details?: Record<string, unknown>) {
    super(message)
    this.name = 'CairnProblem'
    this.code = code
    this.details = details
  }
  get status(): number {
    return ERROR_STATUS[this.code]
  }
}
