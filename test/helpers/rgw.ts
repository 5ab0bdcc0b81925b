import { execFile, execFileSync } from 'node:child_process'
import { mkdtemp } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { promisify } from 'node:util'
import { S3Client } from '@aws-sdk/client-s3'

const run = promisify(execFile)
const SCRIPT = path.resolve(import.meta.dirname, '../object-store/rgw.sh')

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
  // The script picks free ports before its daemons bind them; on a machine where other tests bind
  // ports all the time one can be taken in between. A failed bring-up is made again, in a fresh
  // directory on fresh ports.
  let dir = ''
  let stdout = ''
  for (let attempt = 1; ; attempt++) {
    dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-rgw-'))
    try {
      ;({ stdout } = await run('bash', [SCRIPT, 'up', dir], { timeout: 180_000 }))
      break
    } catch (error) {
      await run('bash', [SCRIPT, 'down', dir]).catch(() => undefined)
      if (attempt >= 3) throw error
      console.warn(`the test object store did not come up (attempt ${attempt}), trying again: ${error}`)
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
      await run('bash', [SCRIPT, 'down', dir])
    },
  }
  return store
}
