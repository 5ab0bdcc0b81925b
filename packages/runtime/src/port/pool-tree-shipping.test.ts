import { execFileSync } from 'node:child_process'
import { mkdir, stat, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { Readable } from 'node:stream'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import {
  makeRevision,
  openTestRuntime,
  SANDBOX_UID,
  sessionId,
  type TestRuntime,
} from '../../test/harness.js'
import { LocalRuntimePort } from './local-runtime-port.js'

const clock = { now: () => Date.now() }
let source: TestRuntime
let target: TestRuntime
let from: LocalRuntimePort
let to: LocalRuntimePort
const REVISION = 'rev_shipped'
const ENV_KEY = 'npm-0123456789abcdef0123'

async function readAll(stream: Readable): Promise<string> {
  const chunks: Buffer[] = []
  for await (const chunk of stream) chunks.push(chunk as Buffer)
  return Buffer.concat(chunks).toString('utf8')
}

beforeAll(async () => {
  source = await openTestRuntime()
  target = await openTestRuntime()
  from = new LocalRuntimePort(source.runtime, { clock })
  to = new LocalRuntimePort(target.runtime, { clock })
  await makeRevision(source.runtime, REVISION, { 'agent.py': 'print("hi")\n', 'lib/util.sh': 'echo util\n' })
  // A dependency environment as a build seals one: a subvolume under envs/<key>.
  const staging = await source.runtime.pool.createStaging('envbuild_shiptest')
  await mkdir(path.join(staging, 'node_modules', 'left-pad'), { recursive: true })
  await writeFile(path.join(staging, 'node_modules', 'left-pad', 'index.js'), 'module.exports = 1\n')
  const envDir = path.join(source.runtime.pool.root, 'envs')
  await mkdir(envDir, { recursive: true })
  await source.runtime.pool.sealStaging(staging, path.join(envDir, ENV_KEY))
}, 120_000)

afterAll(async () => {
  await source?.close()
  await target?.close()
})

describe('shipping pool trees between nodes', () => {
  it('ships a revision whole: a workspace made from it on the other node has its files, owned by the sandbox uid', async () => {
    expect(await to.hasTree({ revisionId: REVISION })).toBe(false)
    await to.importPoolTree(
      { revisionId: REVISION },
      'ten_ship',
      await from.exportPoolTree({ revisionId: REVISION }),
    )
    expect(await to.hasTree({ revisionId: REVISION })).toBe(true)
    const shipped = target.runtime.pool.revisionPath(REVISION)
    expect((await stat(path.join(shipped, 'lib', 'util.sh'))).uid).toBe(SANDBOX_UID)
    const id = sessionId('ship')
    await to.createWorkspace(id, REVISION, 'ten_ship')
    const file = await to.openFile({ sessionId: id }, Buffer.from('lib/util.sh'))
    expect(await readAll(file.stream)).toBe('echo util\n')
    // Sealed read-only, as a built revision is.
    expect(() => execFileSync('touch', [path.join(shipped, 'new')], { stdio: 'pipe' })).toThrow()
    // A second import of a tree already there keeps it and drains the stream.
    await to.importPoolTree(
      { revisionId: REVISION },
      'ten_ship',
      await from.exportPoolTree({ revisionId: REVISION }),
    )
    expect(await to.hasTree({ revisionId: REVISION })).toBe(true)
  })

  it('imports of one tree at once (two API replicas shipping it) all succeed: one copy, no staging left', async () => {
    await makeRevision(source.runtime, 'rev_raced', { 'agent.py': 'print("raced")\n' })
    const tree = { revisionId: 'rev_raced' }
    const streams = await Promise.all([1, 2, 3, 4].map(() => from.exportPoolTree(tree)))
    await Promise.all(streams.map((stream) => to.importPoolTree(tree, 'ten_ship', stream)))
    expect(await to.hasTree(tree)).toBe(true)
    expect(await target.runtime.pool.listArea('staging')).toEqual([])
    const file = await to.openFile(tree, Buffer.from('agent.py'))
    expect(await readAll(file.stream)).toBe('print("raced")\n')
  })

  it('ships a dependency environment under its key', async () => {
    const tree = { dependencyEnvKey: ENV_KEY }
    await to.importPoolTree(tree, 'ten_ship', await from.exportPoolTree(tree))
    const shipped = path.join(
      target.runtime.pool.root,
      'envs',
      ENV_KEY,
      'node_modules',
      'left-pad',
      'index.js',
    )
    expect((await stat(shipped)).isFile()).toBe(true)
  })

  it('a tree the source lacks is not_found; a broken stream leaves nothing behind', async () => {
    await expect(from.exportPoolTree({ revisionId: 'rev_absent' })).rejects.toMatchObject({
      code: 'not_found',
    })
    const broken = new Readable({
      read() {
        this.destroy(new Error('link cut'))
      },
    })
    await expect(to.importPoolTree({ revisionId: 'rev_broken' }, 'ten_ship', broken)).rejects.toThrow()
    expect(await to.hasTree({ revisionId: 'rev_broken' })).toBe(false)
    expect(await target.runtime.pool.listArea('staging')).toEqual([])
    const garbage = Readable.from([Buffer.from('not a tar at all\n'.repeat(64))])
    await expect(to.importPoolTree({ revisionId: 'rev_garbage' }, 'ten_ship', garbage)).rejects.toMatchObject(
      {
        code: 'storage_error',
      },
    )
    expect(await to.hasTree({ revisionId: 'rev_garbage' })).toBe(false)
    expect(await target.runtime.pool.listArea('staging')).toEqual([])
  })
})
