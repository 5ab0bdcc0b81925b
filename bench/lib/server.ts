import { readFileSync } from 'node:fs'
import { mkdir, mkdtemp, readFile, rm, rmdir, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import * as tar from 'tar'
import { instanceRunDir } from '../../packages/runtime/dist/index.js'
import { type RunningServer, type ServerOptions, startServer } from '../../packages/server/dist/index.js'
import { FetchClient, NodeHttpClient } from './client.js'

export const REPO_ROOT = path.resolve(import.meta.dirname, '..', '..')
export const EXAMPLES = path.join(REPO_ROOT, 'examples')

export interface BenchServer {
  server: RunningServer
  url: string
  key: string
  dataDir: string
  http: NodeHttpClient
  fetch: FetchClient
  deploy(dir: string): Promise<{ agent: string; revision: string; ms: number }>
  createSession(agent: string, extra?: Record<string, unknown>): Promise<{ id: string; ms: number }>
  deleteSession(id: string): Promise<void>
  /** Stops the server and removes its data dir, unless `keepData` (to start it again on the same dir). */
  close(options?: { keepData?: boolean }): Promise<void>
}

export interface BenchServerOptions {
  /** Start on this existing data dir (a server closed with `keepData`) instead of a fresh one. */
  dataDir?: string
  /** Passed to startServer over the bench defaults. */
  server?: ServerOptions
}

/**
 * The built server (packages/server/dist), in this process, on an ephemeral port with its own
 * data dir and loop-backed btrfs pool: the same set-up as the tests.
 */
export async function startBenchServer(options: BenchServerOptions = {}): Promise<BenchServer> {
  const dataDir = options.dataDir ?? (await mkdtemp(path.join(os.tmpdir(), 'cairn-bench-')))
  let server: RunningServer
  try {
    server = await startServer({
      dataDir,
      port: 0,
      writeCredentials: false,
      poolImageSizeBytes: 1024 * 1024 * 1024,
      logLevel: 'error',
      ...options.server,
    })
  } catch (error) {
    await rm(dataDir, { recursive: true, force: true })
    await removeInstanceLeftovers(dataDir)
    throw error
  }
  // The admin key is returned by the first start only; later starts read the file it wrote.
  const key = server.adminKey ?? (await readFile(server.adminKeyPath, 'utf8')).trim()
  const http = new NodeHttpClient(server.url, key)
  const fetchClient = new FetchClient(server.url, key)
  let closed = false
  return {
    server,
    url: server.url,
    key,
    dataDir,
    http,
    fetch: fetchClient,
    async deploy(dir) {
      const archive = await packDir(dir)
      const res = await http.json('POST', '/v1/agents', archive)
      if (res.status !== 201)
        throw new Error(`deploy of ${dir} failed: ${res.status} ${JSON.stringify(res.body)}`)
      return { agent: res.body.agent.name as string, revision: res.body.revision.id as string, ms: res.ms }
    },
    async createSession(agent, extra = {}) {
      const res = await http.json('POST', '/v1/sessions', { agent, ...extra })
      if (res.status !== 201)
        throw new Error(`create session failed: ${res.status} ${JSON.stringify(res.body)}`)
      return { id: res.body.id as string, ms: res.ms }
    },
    async deleteSession(id) {
      const res = await http.json('DELETE', `/v1/sessions/${id}`)
      if (res.status !== 200)
        throw new Error(`delete session failed: ${res.status} ${JSON.stringify(res.body)}`)
    },
    async close({ keepData = false } = {}) {
      if (closed) return
      closed = true
      http.close()
      try {
        await server.close()
      } finally {
        if (!keepData) {
          await rm(dataDir, { recursive: true, force: true })
          await removeInstanceLeftovers(dataDir)
        }
      }
    },
  }
}

export async function packDir(dir: string): Promise<Buffer> {
  const chunks: Buffer[] = []
  for await (const chunk of tar.c({ gzip: true, cwd: dir, portable: true }, ['.']))
    chunks.push(chunk as Buffer)
  return Buffer.concat(chunks)
}

/** The echo agent's loop: each line back as the reply. */
export const ECHO_AGENT = 'while IFS= read -r line; do printf "%s\\n" "$line"; done\n'
/** A shell agent: each line run as a bash command in /workspace, its output and exit status as the reply. */
export const SHELL_AGENT =
  'while IFS= read -r line; do bash -c "$line" </dev/null 2>&1; echo "[exit $?]"; done\n'

/**
 * A throwaway project with `fileCount` files in total (cairn.yaml and the agent included), spread
 * over sub-directories of 500 files; the agent is `agent` (echo by default).
 */
export async function makeProject(name: string, fileCount: number, agent = ECHO_AGENT): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), `cairn-bench-${name}-`))
  await writeFile(path.join(dir, 'cairn.yaml'), `name: ${name}\ncommand: bash agent.sh\nprotocol: stdio\n`)
  await writeFile(path.join(dir, 'agent.sh'), agent)
  for (let i = 0; i < fileCount - 2; i++) {
    const sub = path.join(dir, 'data', `d${Math.floor(i / 500)}`)
    if (i % 500 === 0) await mkdir(sub, { recursive: true })
    await writeFile(path.join(sub, `f${i}.txt`), `file ${i}\n`)
  }
  return dir
}

/**
 * The runtime leaves its per-instance directory under /run/cairn and its (empty) cgroup scope
 * behind when it closes; a bench makes a new instance per run, so it removes both.
 */
export async function removeInstanceLeftovers(dataDir: string): Promise<void> {
  const runDir = instanceRunDir(dataDir)
  const mounts = readFileSync('/proc/mounts', 'utf8')
    .split('\n')
    .map((l) => l.split(' '))
  if (mounts.some((m) => m[1]?.startsWith(`${runDir}/`))) return // still mounted: leave it alone
  await rm(runDir, { recursive: true, force: true })
  const scope = path.join('cairn', path.basename(runDir))
  for (const m of mounts) {
    if (m[2] !== 'cgroup' && m[2] !== 'cgroup2') continue
    await rmdir(path.join(m[1] as string, scope)).catch(() => undefined)
  }
}
