import { stripTerminalEscapes } from './sanitize.js'

/** What the CLI knows about a failure, whatever threw it. */
export interface ErrorInfo {
  code: string | undefined
  message: string
  requestId?: string
}

export interface HintContext {
  apiUrl?: string
}

function field(error: unknown, name: string): unknown {
  return typeof error === 'object' && error !== null ? (error as Record<string, unknown>)[name] : undefined
}

export function errorInfo(error: unknown): ErrorInfo {
  const code = field(error, 'code')
  const message = field(error, 'message')
  const requestId = field(error, 'requestId')
  const info: ErrorInfo = {
    code: typeof code === 'string' ? code : undefined,
    message: stripTerminalEscapes(typeof message === 'string' && message !== '' ? message : String(error)),
  }
  if (typeof requestId === 'string') info.requestId = requestId
  return info
}

/** A hint that fits the error's code: never a hint about agents for a missing session. */
export function hintFor(code: string | undefined, context: HintContext = {}): string | undefined {
  switch (code) {
    case 'unauthorized':
      return 'Check your API key: run `cairn login --api-key <key>` or set CAIRN_API_KEY.'
    case 'forbidden':
      return 'This API key is not allowed to do that; use a key with write access.'
    case 'connection_error':
      return `Is the server running? Start one with \`cairn server\`, or point CAIRN_API_URL at it${context.apiUrl ? ` (now ${context.apiUrl})` : ''}.`
    case 'session_not_found':
      return 'List your sessions with `cairn sessions list`.'
    case 'ambiguous_id':
      return 'Type more characters of the ID.'
    case 'session_deleted':
      return 'A deleted session cannot come back; start a new one with `cairn run <agent>`.'
    case 'session_busy':
      return 'A turn is already running in this session; wait for it or cancel it (Ctrl-C in `cairn run`).'
    case 'session_not_resumable':
      return 'See why it stopped with `cairn sessions get <id>`.'
    case 'turn_limit_reached':
      return 'Raise the limit with `cairn sessions resume <id> --max-turns N`, or fork the session.'
    case 'duration_limit_reached':
      return 'Resume it (the clock restarts) with `cairn sessions resume <id>`, optionally with --max-duration.'
    case 'agent_not_found':
      return 'List your agents with `cairn agents list`, or deploy one with `cairn deploy`.'
    case 'agent_not_ready':
      return "The agent's latest revision is not ready; see `cairn agents get <agent>`."
    case 'revision_not_found':
      return 'See the revisions with `cairn agents get <agent>`.'
    case 'invalid_manifest':
      return 'Fix cairn.yaml (`cairn init` writes a commented example).'
    case 'capability_unavailable':
      return "The server's GET /v1/runtime says which sandbox drivers can and why not; memory needs `isolation: gvisor` in cairn.yaml."
    case 'invalid_archive':
      return 'The upload was not a readable tar.gz; try `cairn deploy` again.'
    case 'secrets_missing':
      return 'Set them with `cairn secrets set <agent> NAME=value`.'
    case 'build_failed':
      return 'See the build log with `cairn agents logs <agent>`; fix the project and deploy again.'
    case 'payload_too_large':
      return 'Leave large files out with `ignore:` in cairn.yaml or a .cairnignore file.'
    case 'agent_crashed':
    case 'agent_protocol_error':
      return 'The session is kept: fix the agent, deploy it, then `cairn sessions resume <id>`.'
    case 'quota_exceeded':
      return 'The storage quota is used up: delete files, or old snapshots with `cairn sessions snapshots rm <session> <snapshot>`.'
    case 'snapshot_in_use':
      return 'A restore, fork or export is reading that snapshot; try again once it is done.'
    case 'snapshot_left_behind':
      return 'The session moved to another node after that snapshot; `cairn sessions move <id> --to <node>` back to use it, or pick a newer one.'
    case 'limit_exceeded':
      return 'The agent hit a memory, process or time limit; raise `limits:` in cairn.yaml.'
    case 'rate_limited':
      return 'Too many requests; wait a moment and try again.'
    case 'timeout':
      return 'The request took too long; try again.'
    case 'internal':
    case 'storage_error':
    case 'sandbox_failed':
    case 'state_lost':
    case 'unavailable':
      return "This is the server's fault; its log has the details."
    case 'invalid_response':
      return 'Is CAIRN_API_URL pointing at a Cairn server?'
    default:
      return undefined
  }
}

/**
 * Whether a turn's stream broke because the connection to the server did: fetch's own error
 * (undici's `TypeError: terminated`, node:http's reset, a closed socket) rather than anything the
 * server said.
 */
export function connectionLost(error: unknown): boolean {
  const code = field(error, 'code')
  if (code === 'connection_error') return true
  // node:http's (the CLI's fetch): the answer ended with its socket (`aborted`, ECONNRESET).
  if (typeof code === 'string' && /^(ECONNRESET|EPIPE|ERR_STREAM_PREMATURE_CLOSE)$/.test(code)) return true
  if (!(error instanceof TypeError)) return false
  const cause = field(error, 'cause')
  const causeCode = field(cause, 'code')
  return (
    error.message === 'terminated' ||
    error.message === 'fetch failed' ||
    (typeof causeCode === 'string' && /^(UND_ERR_SOCKET|UND_ERR_CLOSED|ECONNRESET|EPIPE)$/.test(causeCode))
  )
}

/** What to do about a turn that failed, by its code: the session is kept in every case. */
export function turnFailureHint(code: string | undefined, sessionRef: string): string | undefined {
  switch (code) {
    case 'timeout':
      return `The session is kept: send it again with \`cairn sessions resume ${sessionRef}\`, or give the agent longer (limits.turnTimeoutMs in cairn.yaml, then \`cairn deploy\`).`
    case 'agent_crashed':
    case 'agent_protocol_error':
      return `The session and its workspace are kept: fix the agent, \`cairn deploy\` it, then \`cairn sessions resume ${sessionRef}\`.`
    case 'turn_limit_reached':
      return `Allow more with \`cairn sessions resume ${sessionRef} --max-turns N\` (or --max-turns none), or fork the session.`
    default:
      return hintFor(code)
  }
}

/** `✗ message` and, on the next line, the hint. */
export function renderError(
  error: unknown,
  context: HintContext = {},
  style: { red: (s: string) => string; dim: (s: string) => string } = { red: (s) => s, dim: (s) => s },
): string {
  const info = errorInfo(error)
  const hint = field(error, 'hint')
  const lines = [style.red(`✗ ${info.message}`)]
  const text = typeof hint === 'string' ? hint : hintFor(info.code, context)
  if (text) lines.push(style.dim(`  ${text}`))
  return lines.join('\n')
}
