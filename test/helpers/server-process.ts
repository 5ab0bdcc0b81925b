import { type ChildProcess, spawn } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { readFile } from 'node:fs/promises'
import http from 'node:http'
import path from 'node:path'
import { createInterface } from 'node:readline'
import type { StreamEvent } from '@cairn/protocol'
import { SseParser } from '@cairn/sdk'
import { releasePoolImage, scratchDir } from './scratch.js'
import { REPO_ROOT } from './server.js'

const FIXTURE = path.join(REPO_ROOT, 'test/fixtures/server-process.mjs')

/** A server in a process of its own (its own descriptors and memory), started by `startServerProcess`. */
export interface ServerProcess {
  child: ChildProcess
  url: string
  port: number
  key: string
  /** Stops it (SIGTERM, then the pool image released). */
  stop(): Promise<void>
}

/**
 * Starts `test/fixtures/server-process.mjs` under `prlimit --nofile=<n>:<n>` when `nofile` is
 * given, with `options` as extra server options, on `dataDir` (default: a new one).
 */
export async function startServerProcess(
  options: Record<string, unknown>,
  nofile?: number,
  dataDir?: string,
): Promise<ServerProcess & { dataDir: string }> {
  dataDir ??= await scratchDir('cairn-proc-')
  const argv = [process.execPath, FIXTURE, dataDir, JSON.stringify(options)]
  const child = nofile
    ? spawn('prlimit', [`--nofile=${nofile}:${nofile}`, ...argv], { stdio: ['ignore', 'pipe', 'pipe'] })
    : spawn(argv[0] as string, argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] })
  let stderr = ''
  child.stderr?.setEncoding('utf8').on('data', (chunk: string) => {
    stderr += chunk
  })
  const exited = new Promise<void>((resolve) => child.once('close', () => resolve()))
  const line = await Promise.race([
    new Promise<string>((resolve) =>
      createInterface({ input: child.stdout as NodeJS.ReadableStream }).once('line', resolve),
    ),
    exited.then(() => undefined),
  ])
  if (line === undefined) throw new Error(`the server process did not start: ${stderr}`)
  const url = (JSON.parse(line) as { url: string }).url
  const key = (await readFile(path.join(dataDir, 'admin.key'), 'utf8')).trim()
  return {
    child,
    url,
    dataDir,
    port: Number(new URL(url).port),
    key,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGTERM')
        await exited
      }
      releasePoolImage(path.join(dataDir, 'pool.img'))
    },
  }
}

/** Resident memory of process `pid`, in MiB (`VmRSS` of /proc). */
export function rssMiB(pid: number): number {
  const line = readFileSync(`/proc/${pid}/status`, 'utf8')
    .split('\n')
    .find((l) => l.startsWith('VmRSS:'))
  return Number(line?.split(/\s+/)[1] ?? 0) / 1024
}

/** A client of `url` whose connections come from `localAddress` (another loopback peer: 127.0.0.2). */
export class PeerClient {
  readonly agent: http.Agent

  constructor(
    readonly url: string,
    readonly key: string,
    readonly localAddress: string,
  ) {
    this.agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
  }

  /** One request; the answer's status and body text (undefined status: the connection failed). */
  request(
    method: string,
    route: string,
    body?: unknown,
  ): Promise<{ status: number | undefined; text: string }> {
    return new Promise((resolve) => {
      const payload = body === undefined ? undefined : JSON.stringify(body)
      const req = http.request(
        `${this.url}${route}`,
        {
          method,
          agent: this.agent,
          localAddress: this.localAddress,
          headers: {
            authorization: `Bearer ${this.key}`,
            ...(payload ? { 'content-type': 'application/json' } : {}),
          },
        },
        (res) => {
          let text = ''
          res.setEncoding('utf8').on('data', (chunk: string) => {
            text += chunk
          })
          res.on('end', () => resolve({ status: res.statusCode, text }))
          res.on('error', (error) => resolve({ status: undefined, text: error.message }))
        },
      )
      req.on('error', (error) => resolve({ status: undefined, text: error.message }))
      req.end(payload)
    })
  }

  /** Sends a message to session `id` and reads its stream to the end: the terminal event. */
  async turn(id: string, prompt: string): Promise<StreamEvent | undefined> {
    const { status, text } = await this.request('POST', `/v1/sessions/${id}/messages`, { prompt })
    if (status !== 200) throw new Error(`the turn was refused: ${status} ${text}`)
    const parser = new SseParser()
    const events = [...parser.push(text), ...parser.end()].map((m) => JSON.parse(m.data) as StreamEvent)
    return events.find(
      (e) => e.type === 'run.completed' || e.type === 'run.failed' || e.type === 'run.cancelled',
    )
  }

  close(): void {
    this.agent.destroy()
  }
}
