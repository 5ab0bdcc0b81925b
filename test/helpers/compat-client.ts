// The hosted agent-session product's agent-era clients (its TypeScript SDK and CLI, and the Python
// CLI, before their April 2026 rewrite), as they send requests and read run streams. Written by
// hand from their documented wire behaviour; none of their code is used.
//
// Requests: `<base>/v1/<path>`, a bearer key, `Content-Type: application/json` on every request but
// the multipart deploy, snake_case bodies.
//
// Run streams (`POST /sessions/{id}/messages`), as their SSE reader takes them:
// - the body is read as lines (a trailing `\r` dropped); a line `event: <type>` names the event,
//   each `data: <text>` line adds to its payload, and an empty line ends the event;
// - an event is kept only when it had both a type and a payload, and its type is one of theirs
//   (run.started, message.delta, tool.start, tool.end, status, run.completed, run.failed,
//   run.cancelled, heartbeat); the payload lines are joined with `\n` and parsed as JSON;
// - the SDK then reads, from each payload: `message.delta` → `content` (text, appended);
//   `tool.start` → `tool` (the tool's name, `unknown` when missing) and `input`; `tool.end` →
//   `duration_ms` (closing the tool call started last); `run.completed` → `duration_ms` (the run's
//   duration, 0 when missing) and `max_turns_reached`; `run.failed` → `error.message` (`Unknown
//   error` when missing). Everything else is ignored.

export interface Answer {
  status: number
  json: Record<string, unknown>
}

/** One event as their SSE reader hands it on: the `event:` line's type, the `data:` line's JSON. */
export interface RunEvent {
  type: string
  data: Record<string, unknown>
}

/** What their SDK's `session.run()` resolves to (and `stream.result`), plus a failed run's error text. */
export interface TheirRunResult {
  text: string
  toolCalls: { name: string; input: unknown; duration: number }[]
  finishReason: 'completed' | 'failed'
  duration: number
  maxTurnsReached: boolean
  /** The `error` of their `run-failed` stream event (what a stream consumer is shown). */
  error: string | undefined
}

const THEIR_EVENT_TYPES = new Set([
  'run.started',
  'message.delta',
  'tool.start',
  'tool.end',
  'status',
  'run.completed',
  'run.failed',
  'run.cancelled',
  'heartbeat',
])

/** Their SSE reader: events from `event:` and `data:` lines, as described above. */
export function readTheirEvents(body: string): RunEvent[] {
  const events: RunEvent[] = []
  let type: string | undefined
  let payload: string[] = []
  const finish = () => {
    if (type !== undefined && payload.length > 0 && THEIR_EVENT_TYPES.has(type)) {
      const text = payload.join('\n')
      let data: Record<string, unknown>
      try {
        data = JSON.parse(text) as Record<string, unknown>
      } catch {
        data = { raw: text }
      }
      events.push({ type, data })
    }
    type = undefined
    payload = []
  }
  for (const raw of body.split('\n')) {
    const line = raw.endsWith('\r') ? raw.slice(0, -1) : raw
    if (line === '') finish()
    else if (line.startsWith('event: ')) type = line.slice('event: '.length)
    else if (line.startsWith('data: ')) payload.push(line.slice('data: '.length))
  }
  finish()
  return events
}

const field = <T>(value: unknown, fallback: T): T =>
  value === undefined || value === null ? fallback : (value as T)

/** Their SDK's result of a run, assembled from the events as it assembles it. */
export function theirRunResult(events: RunEvent[]): TheirRunResult {
  const result: TheirRunResult = {
    text: '',
    toolCalls: [],
    finishReason: 'completed',
    duration: 0,
    maxTurnsReached: false,
    error: undefined,
  }
  let open: { name: string; input: unknown } | undefined
  for (const { type, data } of events) {
    if (type === 'message.delta') result.text += field(data.content, '')
    else if (type === 'tool.start') open = { name: field(data.tool, 'unknown'), input: data.input }
    else if (type === 'tool.end' && open) {
      result.toolCalls.push({ ...open, duration: field(data.duration_ms, 0) })
      open = undefined
    } else if (type === 'run.completed') {
      result.duration = field(data.duration_ms, 0)
      result.maxTurnsReached = field(data.max_turns_reached, false)
      result.finishReason = 'completed'
    } else if (type === 'run.failed') {
      result.finishReason = 'failed'
      result.error = field((data.error as { message?: string } | undefined)?.message, 'Unknown error')
    }
  }
  return result
}

type RequestOptions = { json?: unknown; formData?: FormData; params?: Record<string, string> }

export class TheirClient {
  constructor(
    readonly baseUrl: string,
    private readonly token: string | undefined,
  ) {}

  private headers(json: boolean): Record<string, string> {
    const headers: Record<string, string> = { 'User-Agent': 'superserve-cli/compat-test' }
    if (json) headers['Content-Type'] = 'application/json'
    if (this.token !== undefined) headers.Authorization = `Bearer ${this.token}`
    return headers
  }

  async request(method: string, endpoint: string, options: RequestOptions = {}): Promise<Response> {
    let url = `${this.baseUrl}/v1${endpoint}`
    if (options.params) url += `?${new URLSearchParams(options.params).toString()}`
    return fetch(url, {
      method,
      headers: this.headers(options.formData === undefined),
      body: options.formData ?? (options.json ? JSON.stringify(options.json) : undefined),
    })
  }

  async call(method: string, endpoint: string, options: RequestOptions = {}): Promise<Answer> {
    const response = await this.request(method, endpoint, options)
    return { status: response.status, json: (await response.json()) as Record<string, unknown> }
  }

  /** A message to a session, its stream read as their SDK reads it (`params` for Cairn's `?format=`). */
  async stream(
    sessionId: string,
    prompt: string,
    params?: Record<string, string>,
  ): Promise<{ status: number; body: string; events: RunEvent[]; result: TheirRunResult }> {
    const response = await this.request('POST', `/sessions/${encodeURIComponent(sessionId)}/messages`, {
      json: { prompt },
      ...(params === undefined ? {} : { params }),
    })
    const body = await response.text()
    const events = readTheirEvents(body)
    return { status: response.status, body, events, result: theirRunResult(events) }
  }

  async deploy(
    name: string,
    command: string,
    config: Record<string, unknown>,
    tarball: Buffer,
  ): Promise<Answer> {
    const form = new FormData()
    form.append('file', new Blob([tarball]), 'agent.tar.gz')
    form.append('name', name)
    form.append('command', command)
    form.append('config', JSON.stringify(config))
    return this.call('POST', '/agents', { formData: form })
  }
}
