import { createHash } from 'node:crypto'
import { writeFileSync } from 'node:fs'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'
import { treeManifest } from '../helpers/tree.js'

const CYCLES = Number(process.env.CAIRN_SNAPSHOT_CYCLES ?? 1000)
let t: TestServer

beforeAll(async () => {
  // Every cycle keeps its manual snapshot: the operator's snapshot caps are raised to let them all be.
  t = await startTestServer({
    server: {
      rateLimitPerSecond: 0,
      operatorLimits: { maxManualSnapshotsPerSession: CYCLES + 10, maxManualSnapshotsPerTenant: CYCLES + 10 },
    },
  })
  const project = await makeProject({
    'cairn.yaml': 'name: idle\ncommand: bash idle.sh\n',
    'idle.sh': 'while read -r l; do echo ok; done\n',
  })
  expect((await t.api.deploy(project)).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
})

const digest = async (dir: string) =>
  createHash('sha256')
    .update(JSON.stringify(await treeManifest(dir)))
    .digest('hex')

describe('snapshot / restore cycles', () => {
  it(`${CYCLES} cycles on one session lose nothing`, async () => {
    const { id } = await t.api.createSession('idle', { autoSnapshots: false })
    const workspace = t.server.runtime.pool.workspacePath(id)
    let expected = ''
    let lastSnapshot = ''
    for (let cycle = 0; cycle < CYCLES; cycle++) {
      // Keep: this cycle's file. Then write junk after the snapshot, which the restore must undo.
      writeFileSync(path.join(workspace, `kept-${cycle % 50}.txt`), `cycle ${cycle}\n`)
      const snap = await t.api.call('POST', `/v1/sessions/${id}/snapshots`, {})
      expect(snap.status).toBe(201)
      if (cycle === CYCLES - 1) {
        expected = await digest(t.server.runtime.pool.snapshotPath(snap.body.id))
        lastSnapshot = snap.body.id
      }
      writeFileSync(path.join(workspace, `junk-${cycle}.txt`), 'must disappear\n')
      const restored = await t.api.call('POST', `/v1/sessions/${id}/restore`, { snapshotId: snap.body.id })
      expect(restored.status).toBe(200)
    }
    expect(await digest(t.server.runtime.pool.workspacePath(id))).toBe(expected)
    const names = Object.keys(await treeManifest(t.server.runtime.pool.workspacePath(id)))
    expect(names.filter((n) => n.startsWith('junk-'))).toEqual([])
    expect(names.filter((n) => n.startsWith('kept-'))).toHaveLength(Math.min(50, CYCLES))
    // The server's own content digest agrees: the restored workspace is the last snapshot's tree.
    const serverDigest = async (snapshotId: string) =>
      (await t.api.call('GET', `/v1/sessions/${id}/snapshots/${snapshotId}?digest=true`)).body.digest
    const final = await t.api.call('POST', `/v1/sessions/${id}/snapshots`, {})
    expect(await serverDigest(final.body.id)).toBe(await serverDigest(lastSnapshot))
  }, 600_000)
})
