import { existsSync, readdirSync } from 'node:fs'
import { rm } from 'node:fs/promises'
import { gzipSync } from 'node:zlib'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { rawTar, rawTarGz } from './helpers/raw-tar.js'
import { startTestServer, type TestServer } from './helpers/server.js'

let t: TestServer
const MANIFEST = { name: 'cairn.yaml', body: 'name: hostile\ncommand: bash a.sh\n' }
const OUTSIDE = '/tmp/cairn-hostile-escape'

beforeAll(async () => {
  t = await startTestServer({
    server: { maxUploadBytes: 4 * 1024 * 1024, maxUnpackedBytes: 64 * 1024 * 1024, maxArchiveFiles: 20_000 },
  })
  await rm(OUTSIDE, { recursive: true, force: true })
})

afterAll(async () => {
  await t?.close()
  await rm(OUTSIDE, { recursive: true, force: true })
})

function poolArea(area: string): string[] {
  return readdirSync(`${t.server.runtime.pool.root}/${area}`)
}

async function expectRefused(archive: Buffer, code: string, messagePart: string) {
  const revisionsBefore = poolArea('revisions')
  const res = await t.api.call('POST', '/v1/agents', archive)
  expect(res.status, JSON.stringify(res.body)).toBeGreaterThanOrEqual(400)
  expect(res.body.error.code).toBe(code)
  expect(res.body.error.message).toContain(messagePart)
  // Nothing was written: no revision, no staging leftovers, no agent, nothing outside.
  expect(poolArea('revisions')).toEqual(revisionsBefore)
  expect(poolArea('staging')).toEqual([])
  expect((await t.api.call('GET', '/v1/agents/hostile')).status).toBe(404)
  expect(existsSync(OUTSIDE)).toBe(false)
}

describe('hostile archives are refused before anything is written', () => {
  it('refuses path traversal', async () => {
    await expectRefused(
      rawTarGz([MANIFEST, { name: '../../../../tmp/cairn-hostile-escape', body: 'x' }]),
      'invalid_archive',
      "'..'",
    )
    await expectRefused(
      rawTarGz([MANIFEST, { name: 'ok/../../cairn-hostile-escape', body: 'x' }]),
      'invalid_archive',
      "'..'",
    )
  })

  it('refuses absolute paths', async () => {
    await expectRefused(
      rawTarGz([MANIFEST, { name: OUTSIDE, body: 'x' }]),
      'invalid_archive',
      'absolute path',
    )
  })

  it('refuses symlinks and hardlinks that point out of the tree', async () => {
    await expectRefused(
      rawTarGz([MANIFEST, { name: 'etc', type: '2', linkname: '/etc' }]),
      'invalid_archive',
      'absolute path',
    )
    await expectRefused(
      rawTarGz([MANIFEST, { name: 'sub/up', type: '2', linkname: '../../tmp' }]),
      'invalid_archive',
      'outside the project',
    )
    await expectRefused(
      rawTarGz([MANIFEST, { name: 'passwd', type: '1', linkname: '../../etc/passwd' }]),
      'invalid_archive',
      "'..'",
    )
    // Each link stays inside on its own; chained through one another they would not.
    await expectRefused(
      rawTarGz([
        MANIFEST,
        { name: 'sub/', type: '5', mode: 0o755 },
        { name: 'sub/up', type: '2', linkname: '..' },
        { name: 'sub/up/up2', type: '2', linkname: '..' },
        { name: 'sub/up/up2/cairn-hostile-escape', body: 'x' },
      ]),
      'invalid_archive',
      'goes through the symbolic link sub/up',
    )
  })

  it('refuses device files and fifos', async () => {
    await expectRefused(
      rawTarGz([MANIFEST, { name: 'null', type: '3' }]),
      'invalid_archive',
      'CharacterDevice',
    )
    await expectRefused(rawTarGz([MANIFEST, { name: 'pipe', type: '6' }]), 'invalid_archive', 'FIFO')
  })

  it('refuses a decompression bomb by its unpacked size', async () => {
    const zeros = Buffer.alloc(80 * 1024 * 1024)
    const bomb = gzipSync(rawTar([MANIFEST, { name: 'zeros.bin', body: zeros }]), { level: 9 })
    expect(bomb.length).toBeLessThan(1024 * 1024)
    await expectRefused(bomb, 'invalid_archive', 'more than 67108864 bytes')
  })

  it('refuses an archive with too many files', async () => {
    const entries = [MANIFEST, ...Array.from({ length: 20_001 }, (_, i) => ({ name: `f/${i}`, body: '' }))]
    await expectRefused(rawTarGz(entries), 'invalid_archive', 'more than 20000 entries')
  })

  it('answers 413 with the limit when the upload is too large', async () => {
    const big = Buffer.alloc(5 * 1024 * 1024, 7)
    const res = await t.api.call('POST', '/v1/agents', big)
    expect(res.status).toBe(413)
    expect(res.body.error.code).toBe('payload_too_large')
    expect(res.body.error.message).toContain('4194304 bytes')
  })

  it('accepts links that stay inside the tree', async () => {
    const ok = rawTarGz([
      { name: 'cairn.yaml', body: 'name: linked\ncommand: bash a.sh\n' },
      { name: 'a.sh', body: 'while read -r l; do cat data/link.txt; done\n' },
      { name: 'data/real.txt', body: 'inside\n' },
      { name: 'data/link.txt', type: '2', linkname: 'real.txt' },
    ])
    const res = await t.api.call('POST', '/v1/agents', ok)
    expect(res.status).toBe(201)
    const session = await t.api.createSession('linked')
    expect((await t.api.send(session.id, 'go')).text).toBe('inside\n')
  })
})
