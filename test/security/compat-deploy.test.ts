import { randomBytes } from 'node:crypto'
import { once } from 'node:events'
import { createGzip } from 'node:zlib'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type Answer, TheirClient } from '../helpers/compat-client.js'
import { tarHeader } from '../helpers/raw-tar.js'
import { startTestServer, type TestServer } from '../helpers/server.js'

/**
 * The compat deploy is the native deploy behind a translation (issue 28 item 4, issue 29 item 2):
 * their multipart form is read as it streams in and its tarball goes, compressed, through the
 * native deploy's size, decompression and hostile-archive checks. Three ~1 MiB uploads unpacking
 * to 1,000 MiB each took the server to 9.1 GiB before: each was gunzipped into one Buffer.
 */
const MiB = 1024 * 1024
const PREFIX = '/compat'
const MAX_UNPACKED_MIB = 256
const MAX_UPLOAD_MIB = 4
const BOMB_ENTRIES = 8
const BOMB_ENTRY_MIB = 64

/** A tar.gz of `entries` files of zeros, each `entryBytes` long, gzipped as it is made. */
async function gzipBomb(entries: number, entryBytes: number): Promise<Buffer> {
  const gzip = createGzip({ level: 9 })
  const chunks: Buffer[] = []
  gzip.on('data', (chunk: Buffer) => chunks.push(chunk))
  const ended = once(gzip, 'end')
  const zeros = Buffer.alloc(MiB)
  for (let i = 0; i < entries; i++) {
    gzip.write(tarHeader({ name: `zeros-${i}.bin` }, entryBytes))
    for (let written = 0; written < entryBytes; written += zeros.length)
      if (!gzip.write(zeros)) await once(gzip, 'drain')
  }
  gzip.end(Buffer.alloc(1024))
  await ended
  return Buffer.concat(chunks)
}

describe('compat deploy: the native deploy’s checks, nothing unpacked in memory', () => {
  let t: TestServer
  let client: TheirClient
  let bomb: Buffer

  beforeAll(async () => {
    t = await startTestServer({
      server: {
        compatPrefix: PREFIX,
        maxUnpackedBytes: MAX_UNPACKED_MIB * MiB,
        maxUploadBytes: MAX_UPLOAD_MIB * MiB,
        rateLimitPerSecond: 0,
      },
    })
    client = new TheirClient(`${t.url}${PREFIX}`, t.key)
    bomb = await gzipBomb(BOMB_ENTRIES, BOMB_ENTRY_MIB * MiB)
  })
  afterAll(async () => {
    await t?.close()
  })

  it('refuses three concurrent gzip bombs with the native error, and the server’s memory stays bounded', async () => {
    expect(bomb.length).toBeLessThan(MiB)
    const baselineBytes = process.memoryUsage().rss
    let peakBytes = baselineBytes
    const sampler = setInterval(() => {
      peakBytes = Math.max(peakBytes, process.memoryUsage().rss)
    }, 10)
    let native: Awaited<ReturnType<typeof t.api.call>>
    let answers: Answer[]
    try {
      // The native deploy meets the bomb first: its checks inflate it a little at a time too.
      native = await t.api.call('POST', '/v1/agents', bomb)
      answers = await Promise.all(
        [1, 2, 3].map((i) => client.deploy(`bomb-${i}`, 'python agent.py', {}, bomb)),
      )
    } finally {
      clearInterval(sampler)
    }
    peakBytes = Math.max(peakBytes, process.memoryUsage().rss)
    expect(native.status).toBe(400)
    expect(native.body.error.code).toBe('invalid_archive')
    for (const answer of answers) {
      expect(answer.status, JSON.stringify(answer.json)).toBe(400)
      expect(answer.json).toMatchObject({ code: 'invalid_archive', detail: native.body.error.message })
    }
    // 4 × 512 MiB unpacked, 256 MiB allowed: inflated in one piece, one upload alone held 256 MiB or more.
    expect(peakBytes - baselineBytes).toBeLessThan(96 * MiB)
    expect((await t.api.call('GET', '/v1/agents')).body.data).toEqual([])
  })

  it('refuses a tarball over the upload cap as the native deploy does (413 payload_too_large)', async () => {
    const big = randomBytes((MAX_UPLOAD_MIB + 1) * MiB)
    const native = await t.api.call('POST', '/v1/agents', big)
    expect(native.status).toBe(413)
    const answer = await client.deploy('too-big', 'python agent.py', {}, big)
    expect(answer.status, JSON.stringify(answer.json)).toBe(413)
    expect(answer.json.code).toBe(native.body.error.code)
  })

  it('refuses a hostile archive with the native error: an entry escaping the project', async () => {
    const { rawTarGz } = await import('../helpers/raw-tar.js')
    const hostile = rawTarGz([{ name: '../escape.txt', body: 'x' }])
    const native = await t.api.call('POST', '/v1/agents', hostile)
    const answer = await client.deploy('hostile', 'python agent.py', {}, hostile)
    expect(answer.status).toBe(native.status)
    expect(answer.json).toMatchObject({ code: 'invalid_archive', detail: native.body.error.message })
  })
})
