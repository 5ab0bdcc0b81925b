import type { ChildProcess } from 'node:child_process'
import { readdirSync } from 'node:fs'
import path from 'node:path'
import { treeBytes } from '@cairn/runtime'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createNetnsHost, type NetnsHost, netnsAddresses } from '../helpers/netns.js'
import { ociAgent } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'

// A hostile registry (test/fixtures/lying-registry.mjs, in a network namespace of its own: a
// registry is outside the machine) against `--max-image-mib 32`: one image whose manifest declares
// three 64 MiB layers, one that declares a 1 KiB layer and sends 512 MiB. Every layer's digest is
// false, so skopeo's own check fails only once the bytes are in. The pull must stop at the cap.
const SUBNET = 243
const { address: REGISTRY_HOST } = netnsAddresses(SUBNET)
const REGISTRY = `${REGISTRY_HOST}:5000`
const MiB = 1024 * 1024
const CAP_MIB = 32
/** What lands between two measurements of the staging tree, and what the relays hold in flight. */
const MARGIN_MIB = 32
let netnsHost: NetnsHost | undefined
let registry: ChildProcess | undefined
let t: TestServer

beforeAll(async () => {
  netnsHost = createNetnsHost('ipull', SUBNET)
  registry = netnsHost.spawn(
    [
      process.execPath,
      path.join(import.meta.dirname, '../fixtures/lying-registry.mjs'),
      REGISTRY_HOST,
      '5000',
    ],
    { stdio: 'ignore' },
  )
  for (let i = 0; i < 100 && !(await layerBytesSent().catch(() => undefined)); i++)
    await new Promise((r) => setTimeout(r, 100))
  t = await startTestServer({ server: { egressPrivateExceptions: [REGISTRY_HOST], maxImageMiB: CAP_MIB } })
}, 120_000)

afterAll(async () => {
  await t?.close()
  registry?.kill('SIGKILL')
  netnsHost?.remove()
})

async function layerBytesSent(): Promise<number> {
  const res = await fetch(`http://${REGISTRY}/stats`)
  return ((await res.json()) as { layerBytesSent: number }).layerBytesSent
}

/** The pool's staging area measured every few milliseconds until `done` settles: the largest total seen. */
async function peakStagedBytes<T>(done: Promise<T>): Promise<{ result: T; peakBytes: number }> {
  const staging = path.join(t.server.runtime.pool.root, 'staging')
  let settled = false
  let peakBytes = 0
  const result = done.finally(() => {
    settled = true
  })
  while (!settled) {
    peakBytes = Math.max(peakBytes, await treeBytes(staging))
    await new Promise((r) => setTimeout(r, 10))
  }
  return { result: await result, peakBytes }
}

async function settledRevision(agent: string) {
  for (let i = 0; i < 400; i++) {
    const revision = (await t.api.call('GET', `/v1/agents/${agent}`)).body.revisions?.[0]
    if (revision && revision.status !== 'DEPLOYING') return revision
    await new Promise((r) => setTimeout(r, 100))
  }
  throw new Error(`${agent} still DEPLOYING`)
}

describe('image pulls stop at the cap', () => {
  it('refuses an image whose manifest declares more than the cap, before any layer is downloaded', async () => {
    const before = await layerBytesSent()
    const res = await t.api.deploy(await ociAgent('declared', `${REGISTRY}/team/declared-64mib:1`))
    expect(res.status, JSON.stringify(res.body)).toBe(422)
    expect(res.body.error.code).toBe('image_too_large')
    expect(res.body.error.message).toMatch(/declares 192\.0 MiB.*32\.0 MiB \(--max-image-mib\)/)
    expect(await layerBytesSent()).toBe(before)
    expect(readdirSync(path.join(t.server.runtime.pool.root, 'staging'))).toEqual([])
  })

  it('cuts a registry that sends more than it declared at the cap, and leaves nothing staged', async () => {
    const before = await layerBytesSent()
    const { result: deployed, peakBytes } = await peakStagedBytes(
      (async () => {
        const res = await t.api.deploy(await ociAgent('lies', `${REGISTRY}/team/lies-512mib:1`))
        expect(res.status, JSON.stringify(res.body)).toBe(201)
        return settledRevision('lies')
      })(),
    )
    expect(deployed.status).toBe('FAILED')
    expect(deployed.error).toMatch(
      /the pull of .*lies-512mib:1 wrote more than .*32\.0 MiB \(--max-image-mib\)/,
    )
    expect(peakBytes).toBeLessThanOrEqual((CAP_MIB + MARGIN_MIB) * MiB)
    expect(await layerBytesSent()).toBeLessThan(before + (CAP_MIB + MARGIN_MIB) * MiB)
    expect(readdirSync(path.join(t.server.runtime.pool.root, 'staging'))).toEqual([])
  })
})
