import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import type { StreamEvent } from '@cairn/protocol'
import { SseParser } from '@cairn/sdk'
import { type RunningServer, type ServerOptions, startServer } from '@cairn/server'
import * as tar from 'tar'
import { testDatabaseFor } from '../fixtures/test-database.mjs'

export const REPO_ROOT = path.resolve(import.meta.dirname, '../..')
export const EXAMPLES = path.join(REPO_ROOT, 'examples')

export interface TestServer {
  server: RunningServer
  url: string
  key: string
  dataDir: string
  api: Api
  close(): Promise<void>
}

/**
 * A real server on an ephemeral port with its own data dir and loop-backed btrfs pool; with
 * CAIRN_TEST_DATABASE=postgres, on a PostgreSQL database of its own (the same one again when it
 * is started again on the same data dir).
 */
export async function startTestServer(
  options: { dataDir?: string; reaperIntervalMs?: number; server?: Partial<ServerOptions> } = {},
): Promise<TestServer> {
  const dataDir = options.dataDir ?? (await mkdtemp(path.join(os.tmpdir(), 'cairn-test-')))
  const server = await startServer({
    dataDir,
    database: await testDatabaseFor(dataDir),
    port: 0,
    writeCredentials: false,
    poolImageSizeBytes: 1024 * 1024 * 1024,
    logLevel: 'error',
    reaperIntervalMs: options.reaperIntervalMs,
    ...options.server,
  })
  const key = server.adminKey ?? ''
  return {
    server,
    url: server.url,
    key,
    dataDir,
    api: new Api(server.url, key),
    async close() {
      await server.close()
      if (!options.dataDir) await rm(dataDir, { recursive: true, force: true })
    },
  }
}

export async function packDir(dir: string): Promise<Buffer> {
  const chunks: Buffer[] = []
  const stream = tar.c({ gzip: true, cwd: dir, portable: true }, ['.'])
  for await (const chunk of stream) chunks.push(chunk as Buffer)
  return Buffer.concat(chunks)
}

export interface RunResult {
  status: number
  events: StreamEvent[]
  text: string
  terminal: StreamEvent | undefined
  body: unknown
}

/** A thin HTTP client for tests (raw fetch, so the server's wire format is what is asserted). */
export class Api {
  constructor(
    readonly url: string,
    readonly key: string,
  ) {}

  async call(method: string, route: string, body?: unknown, headers: Record<string, string> = {}) {
    const init: RequestInit = { method, headers: { authorization: `Bearer ${this.key}`, ...headers } }
    if (body !== undefined) {
      if (Buffer.isBuffer(body)) {
        init.body = body
        ;(init.headers as Record<string, string>)['content-type'] ??= 'application/gzip'
      } else if (typeof body === 'string') {
        init.body = body
        ;(init.headers as Record<string, string>)['content-type'] ??= 'application/json'
      } else {
        init.body = JSON.stringify(body)
        ;(init.headers as Record<string, string>)['content-type'] = 'application/json'
      }
    }
    const res = await fetch(this.url + route, init)
    const text = await res.text()
    let json: unknown
    try {
      json = JSON.parse(text)
    } catch {
      json = text
    }
    // biome-ignore lint/suspicious/noExplicitAny: test convenience
    return { status: res.status, body: json as any }
  }

  async deploy(dir: string, name?: string) {
    const archive = await packDir(dir)
    return this.call('POST', `/v1/agents${name ? `?name=${name}` : ''}`, archive)
  }

  async createSession(agent: string, extra: Record<string, unknown> = {}) {
    const res = await this.call('POST', '/v1/sessions', { agent, ...extra })
    if (res.status !== 201)
      throw new Error(`create session failed: ${res.status} ${JSON.stringify(res.body)}`)
    return res.body as { id: string }
  }

  /** The ID of the automatic snapshot that follows `turn` (taken in the background once the turn ends). */
  /** The session's manifest (`GET …/manifest`), asserted to answer 200. */
  async manifest(sessionId: string) {
    const res = await this.call('GET', `/v1/sessions/${sessionId}/manifest`)
    if (res.status !== 200) throw new Error(`manifest failed: ${res.status} ${JSON.stringify(res.body)}`)
    return res.body
  }

  async snapshotAfter(sessionId: string, turn: number): Promise<string> {
    for (let i = 0; i < 200; i++) {
      const list = await this.call('GET', `/v1/sessions/${sessionId}/snapshots`)
      const found = (list.body.data as { id: string; turn: number }[]).find((s) => s.turn === turn)
      if (found) return found.id
      await new Promise((r) => setTimeout(r, 50))
    }
    throw new Error(`no snapshot after turn ${turn}`)
  }

  /** Sends a message and reads the SSE stream to its end. */
  async send(sessionId: string, prompt: string): Promise<RunResult> {
    const res = await fetch(`${this.url}/v1/sessions/${sessionId}/messages`, {
      method: 'POST',
      headers: { authorization: `Bearer ${this.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ prompt }),
    })
    if (!res.headers.get('content-type')?.startsWith('text/event-stream')) {
      return { status: res.status, events: [], text: '', terminal: undefined, body: await res.json() }
    }
    const parser = new SseParser()
    const messages = [...parser.push(await res.text()), ...parser.end()]
    const events = messages.map((message) => JSON.parse(message.data) as StreamEvent)
    const text = events.flatMap((e) => (e.type === 'message.delta' ? [e.content] : [])).join('')
    const terminal = events.find(
      (e) => e.type === 'run.completed' || e.type === 'run.failed' || e.type === 'run.cancelled',
    )
    return { status: res.status, events, text, terminal, body: undefined }
  }
}
