import { execFile } from 'node:child_process'
import { rm } from 'node:fs/promises'
import path from 'node:path'
import { promisify } from 'node:util'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'

const run = promisify(execFile)
let t: TestServer
let filler: string

beforeAll(async () => {
  // A pool small enough to fill in a fraction of a second.
  t = await startTestServer({ server: { poolImageSizeBytes: 128 * 1024 * 1024 } })
  filler = path.join(t.server.runtime.pool.root, 'filler.bin')
  const project = await makeProject({
    'cairn.yaml': 'name: writer\ncommand: python3 writer.py\n',
    'writer.py': [
      'while True:',
      '    line = input()',
      '    open("log.txt", "a").write(line + "\\n")',
      '    open("blob-" + line + ".bin", "wb").write(b"x" * (1 << 20))',
      '    print("kept", " ".join(open("log.txt").read().split()))',
    ].join('\n'),
  })
  expect((await t.api.deploy(project)).status).toBe(201)
})

afterAll(async () => {
  await rm(filler, { force: true }).catch(() => undefined)
  await t?.close()
})

/** Fills the pool from the host until the kernel says ENOSPC. */
async function fillPool(): Promise<void> {
  await run('dd', ['if=/dev/zero', `of=${filler}`, 'bs=1M', 'status=none']).catch(() => undefined)
  await run('btrfs', ['filesystem', 'sync', t.server.runtime.pool.root])
}

describe('disk full on the pool', () => {
  it('fails the turn and file writes with storage_error; once space is freed the session resumes intact', async () => {
    const session = await t.api.createSession('writer')
    expect((await t.api.send(session.id, 'first')).text).toBe('kept first\n')

    await fillPool()
    const turn = await t.api.send(session.id, 'second')
    expect(turn.terminal?.type).toBe('run.failed')
    const failure = (turn.terminal as { error: { code: string; message: string } }).error
    expect(failure.code).toBe('storage_error')
    expect(failure.message).toContain('the storage pool is full')
    expect((await t.api.call('GET', `/v1/sessions/${session.id}`)).body).toMatchObject({
      status: 'failed',
      statusCause: 'storage_error',
    })

    const put = await t.api.call(
      'PUT',
      `/v1/sessions/${session.id}/files/content?path=upload.bin`,
      Buffer.alloc(2 * 1024 * 1024, 1),
      { 'content-type': 'application/octet-stream' },
    )
    expect(put.status).toBe(500)
    expect(put.body.error.code).toBe('storage_error')
    expect(put.body.error.message).toContain('the storage pool is full')
    // So does a deploy (before, its unpack answered 400 invalid_archive, as if the archive were
    // bad), and it leaves nothing staged.
    const deploy = await t.api.deploy(await makeProject({ 'cairn.yaml': 'name: late\ncommand: cat\n' }))
    expect(deploy.status).toBe(500)
    expect(deploy.body.error.code).toBe('storage_error')
    expect(deploy.body.error.message).toContain('the storage pool is full')
    expect(await t.server.runtime.pool.listArea('staging')).toEqual([])

    await rm(filler)
    await run('btrfs', ['filesystem', 'sync', t.server.runtime.pool.root])
    const resumed = await t.api.call('POST', `/v1/sessions/${session.id}/resume`)
    expect(resumed.status).toBe(200)
    const again = await t.api.send(session.id, 'third')
    expect(again.terminal?.type).toBe('run.completed')
    // What the failed turn managed to append before the disk filled up is there too.
    expect(again.text).toMatch(/^kept first (second )?third\n$/)
    const transcript = await t.api.call('GET', `/v1/sessions/${session.id}/messages`)
    expect(transcript.body.data.map((m: { status?: string }) => m.status ?? 'user')).toEqual([
      'user',
      'completed',
      'user',
      'failed',
      'user',
      'completed',
    ])
  })
})
