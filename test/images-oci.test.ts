import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createNetnsHost, type NetnsHost, netnsAddresses } from './helpers/netns.js'
import { buildImage, imageDigest, pushImage, registries, startRegistry } from './helpers/oci-registry.js'
import { makeProject, ociAgent } from './helpers/projects.js'
import { scratchDir } from './helpers/scratch.js'
import { startTestServer, type TestServer } from './helpers/server.js'

// A real registry (Debian's docker-registry) on a test host in its own network namespace, holding
// an image this file builds with umoci and pushes with skopeo. The server pulls it through the
// egress proxy, which the operator lets reach that private address.
const SUBNET = 239
const { address: REGISTRY_HOST } = netnsAddresses(SUBNET)
const REFERENCE = `${REGISTRY_HOST}:5000/team/base:1.4`
let netnsHost: NetnsHost | undefined
let pushedDigest = ''
let t: TestServer

beforeAll(async () => {
  netnsHost = createNetnsHost('oci', SUBNET)
  const storage = await scratchDir('cairn-registry-')
  await startRegistry(storage, `${REGISTRY_HOST}:5000`, netnsHost)
  const layout = buildImage(await scratchDir('cairn-oci-'))
  pushImage(layout, REFERENCE)
  pushedDigest = imageDigest(REFERENCE)
  t = await startTestServer({ server: { egressPrivateExceptions: [REGISTRY_HOST] } })
}, 120_000)

afterAll(async () => {
  await t?.close()
  for (const registry of registries) registry.kill('SIGKILL')
  netnsHost?.remove()
})

async function waitReady(agent: string) {
  for (let i = 0; i < 240; i++) {
    const res = await t.api.call('GET', `/v1/agents/${agent}`)
    const revision = res.body.revisions?.[0]
    if (revision && revision.status !== 'DEPLOYING') return revision
    await new Promise((r) => setTimeout(r, 250))
  }
  throw new Error(`revision of ${agent} still DEPLOYING`)
}

describe('OCI images', () => {
  it('pulls an image by reference from a real registry, keyed by its digest, and runs the agent on it', async () => {
    const deployed = await t.api.deploy(await ociAgent('oci', REFERENCE))
    expect(deployed.status, JSON.stringify(deployed.body)).toBe(201)
    const revision = await waitReady('oci')
    expect(revision.status, revision.error ?? '').toBe('READY')
    expect(pushedDigest).toMatch(/^sha256:[0-9a-f]{64}$/)
    expect(revision.imageKey).toBe(`oci-${pushedDigest.slice('sha256:'.length)}`)
    const log = JSON.stringify((await t.api.call('GET', `/v1/agents/oci/revisions/${revision.id}/logs`)).body)
    expect(log).toContain(`image: pulling ${REFERENCE} (${pushedDigest})`)

    const session = await t.api.createSession('oci')
    const reply = await t.api.send(session.id, 'hello')
    expect(reply.terminal?.type, JSON.stringify(reply.events.slice(-2))).toBe('run.completed')
    expect(reply.text).toBe('marker: built by the OCI test, root: image\n')
    // exec: a sandbox per turn, so what one turn writes in the root is gone in the next.
    expect((await t.api.send(session.id, 'write')).text).toBe('wrote /etc/note\n')
    expect((await t.api.send(session.id, 'read')).text).toBe('no note\n')

    const manifest = await t.api.call('GET', `/v1/sessions/${session.id}/manifest`)
    expect(manifest.body.baseImage).toBe(`${REFERENCE} (${pushedDigest})`)
    const images = await t.api.call('GET', '/v1/images')
    expect(images.body.data).toEqual([
      expect.objectContaining({
        kind: 'oci',
        source: REFERENCE,
        digest: pushedDigest,
        revisions: [{ id: revision.id, agentId: deployed.body.agent.id }],
      }),
    ])

    // The same digest again: nothing to pull, READY in the deploy's answer.
    const again = await t.api.deploy(await ociAgent('oci-again', REFERENCE))
    expect(again.body.revision).toMatchObject({ status: 'READY', imageKey: revision.imageKey })
  })

  it('runs the same image under gVisor, whose own overlay makes the root writable and reset', async (ctx) => {
    const drivers = (await t.api.call('GET', '/v1/runtime')).body.drivers as {
      name: string
      available: boolean
    }[]
    if (!drivers.find((d) => d.name === 'gvisor')?.available) ctx.skip()
    const dir = await makeProject({
      'cairn.yaml': `name: oci-gvisor\ncommand: [/bin/sh, /agent.sh]\nprotocol: exec\nisolation: gvisor\nimage: ${REFERENCE}\n`,
    })
    const deployed = await t.api.deploy(dir)
    expect(deployed.status, JSON.stringify(deployed.body)).toBe(201)
    expect((await waitReady('oci-gvisor')).status).toBe('READY')
    const session = await t.api.createSession('oci-gvisor')
    const reply = await t.api.send(session.id, 'hello')
    expect(reply.text, JSON.stringify(reply.events.slice(-2))).toBe(
      'marker: built by the OCI test, root: image\n',
    )
    expect((await t.api.send(session.id, 'write')).text).toBe('wrote /etc/note\n')
    expect((await t.api.send(session.id, 'read')).text).toBe('no note\n')
    const manifest = await t.api.call('GET', `/v1/sessions/${session.id}/manifest`)
    expect(manifest.body.driver).toBe('gvisor')
    expect((await t.api.call('DELETE', '/v1/agents/oci-gvisor')).status).toBe(200)
  })

  it('collects an image once no revision uses it: agents deleted and their sessions too', async () => {
    for (const name of ['oci', 'oci-again'])
      expect((await t.api.call('DELETE', `/v1/agents/${name}`)).status).toBe(200)
    // A deleted agent's session may still run on the image: it stays.
    expect(await t.server.images.collect()).toEqual({ images: 0, bytesFreed: 0 })
    expect((await t.api.call('GET', '/v1/images')).body.data).toHaveLength(1)
    const sessions = (await t.api.call('GET', '/v1/sessions?limit=100')).body.data as { id: string }[]
    for (const session of sessions)
      expect((await t.api.call('DELETE', `/v1/sessions/${session.id}`)).status).toBeLessThan(300)
    const collected = await t.server.images.collect()
    expect(collected.images).toBe(1)
    expect(collected.bytesFreed).toBeGreaterThan(0)
    expect((await t.api.call('GET', '/v1/images')).body.data).toEqual([])
  })
})
