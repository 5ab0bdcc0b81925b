import { execFile, execFileSync, spawn } from 'node:child_process'
import { mkdir, mkdtemp } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { promisify } from 'node:util'
import { S3Client } from '@aws-sdk/client-s3'

const run = promisify(execFile)
const SCRIPT = path.resolve(import.meta.dirname, '../object-store/rgw.sh')
const STORE_LOCK = path.join(os.tmpdir(), 'cairn-rgw-store.lock')

export interface TestObjectStore {
  endpoint: string
  accessKeyId: string
  secretAccessKey: string
  /** An S3 client configured for RGW (path-style, checksums only when an operation requires one). */
  client(): S3Client
  /**
   * Kills the gateway process alone with SIGKILL (the endpoint refuses connections; the data
   * stays). Synchronous: it is dead when this returns, so a caller can cut the store between two
   * requests of its own.
   */
  killGateway(): void
  /** Starts the gateway again on the same endpoint. */
  startGateway(): Promise<void>
  stop(): Promise<void>
}

/** A real S3 server: Ceph RGW on a one-node cluster (test/object-store/rgw.sh), about 20 s to start. */
export async function startObjectStore(): Promise<TestObjectStore> {
  // One test object store on the machine at a time: a one-node Ceph brought up while another runs
  // was seen to cross with it (its OSD refused by "wrong fsid"). The lock is held by a flock
  // process until `stop` (or this process's end) closes its stdin.
  const holder = spawn('flock', [STORE_LOCK, 'sh', '-c', 'echo locked && exec cat >/dev/null'], {
    stdio: ['pipe', 'pipe', 'inherit'],
  })
  await new Promise<void>((resolve, reject) => {
    holder.stdout.once('data', () => resolve())
    holder.once('exit', (code) => reject(new Error(`flock ${STORE_LOCK} exited ${code}`)))
  })
  const release = () => holder.stdin.end()
  try {
    return await bringUp(release)
  } catch (error) {
    release()
    throw error
  }
}

async function bringUp(release: () => void): Promise<TestObjectStore> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-rgw-'))
  // A one-node Ceph now and then fails to bring its OSD up on a loaded machine (the OSD is refused
  // by its monitor at boot); a second bring-up in a fresh directory is the remedy, not a wait.
  let stdout = ''
  for (let attempt = 1; ; attempt++) {
    try {
      ;({ stdout } = await run('bash', [SCRIPT, 'up', dir], { timeout: 180_000 }))
      break
    } catch (error) {
      await run('bash', [SCRIPT, 'down', dir]).catch(() => undefined)
      if (attempt >= 2) throw error
      await mkdir(dir, { recursive: true })
    }
  }
  const values = Object.fromEntries(
    stdout
      .trim()
      .split('\n')
      .map((line) => [line.slice(0, line.indexOf('=')), line.slice(line.indexOf('=') + 1)]),
  )
  const store: TestObjectStore = {
    endpoint: values.S3_ENDPOINT ?? '',
    accessKeyId: values.S3_ACCESS_KEY_ID ?? '',
    secretAccessKey: values.S3_SECRET_ACCESS_KEY ?? '',
    client: () =>
      new S3Client({
        endpoint: store.endpoint,
        region: 'default',
        forcePathStyle: true,
        credentials: { accessKeyId: store.accessKeyId, secretAccessKey: store.secretAccessKey },
        requestChecksumCalculation: 'WHEN_REQUIRED',
        responseChecksumValidation: 'WHEN_REQUIRED',
      }),
    killGateway() {
      execFileSync('bash', [SCRIPT, 'gateway-kill', dir])
    },
    async startGateway() {
      await run('bash', [SCRIPT, 'gateway-start', dir], { timeout: 120_000 })
    },
    async stop() {
      try {
        await run('bash', [SCRIPT, 'down', dir])
      } finally {
        release()
      }
    },
  }
  return store
}
