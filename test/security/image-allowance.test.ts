import { readdirSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createNetnsHost, type NetnsHost, netnsAddresses } from '../helpers/netns.js'
import { buildImage, pushImage, registries, startRegistry } from '../helpers/oci-registry.js'
import { ociAgent } from '../helpers/projects.js'
import { scratchDir } from '../helpers/scratch.js'
import { Api, startTestServer, type TestServer } from '../helpers/server.js'

// Images are shared trees outside every tenant's pool quota: a tenant deploying distinct images
// (recipes differing only in `packages:`, or digests) would fill the pool for every tenant. Each
// tenant's revisions may run on `--max-images-per-tenant` distinct images (1 here); a deploy of
// one more is refused before anything is pulled, and other tenants deploy on.
const SUBNET = 244
const { address: REGISTRY_HOST } = netnsAddresses(SUBNET)
const FIRST = `${REGISTRY_HOST}:5000/team/first:1`
const SECOND = `${REGISTRY_HOST}:5000/team/second:1`
let netnsHost: NetnsHost | undefined
let t: TestServer

beforeAll(async () => {
  netnsHost = createNetnsHost('iallow', SUBNET)
  await startRegistry(await scratchDir('cairn-registry-'), `${REGISTRY_HOST}:5000`, netnsHost)
  pushImage(buildImage(await scratchDir('cairn-oci-')), FIRST)
  const other = (rootfs: string) => writeFileSync(path.join(rootfs, 'etc/other'), 'a second image\n')
  pushImage(buildImage(await scratchDir('cairn-oci-'), other), SECOND)
  t = await startTestServer({ server: { egressPrivateExceptions: [REGISTRY_HOST], maxImagesPerTenant: 1 } })
}, 120_000)

afterAll(async () => {
  await t?.close()
  for (const registry of registries) registry.kill('SIGKILL')
  netnsHost?.remove()
})

async function deployReady(api: Api, name: string, image: string) {
  const res = await api.deploy(await ociAgent(name, image))
  expect(res.status, JSON.stringify(res.body)).toBe(201)
  let revision: { status: string; error: string | null; imageKey: string } = res.body.revision
  for (let i = 0; i < 200 && revision.status === 'DEPLOYING'; i++) {
    await new Promise((r) => setTimeout(r, 250))
    revision = (await api.call('GET', `/v1/agents/${name}`)).body.revisions[0]
  }
  expect(revision.status, revision.error ?? '').toBe('READY')
  return revision
}

async function tenantApi(tenant: string): Promise<Api> {
  const key = await t.api.call('POST', '/v1/keys', { tenant, role: 'admin' })
  expect(key.status).toBe(201)
  return new Api(t.url, key.body.key)
}

describe('distinct images per tenant', () => {
  it('refuses a tenant one image past its allowance before pulling it, and other tenants deploy on', async () => {
    const first = await deployReady(t.api, 'first', FIRST)
    // The same image again (another agent) costs nothing more.
    await deployReady(t.api, 'again', FIRST)
    const refused = await t.api.deploy(await ociAgent('second', SECOND))
    expect(refused.status, JSON.stringify(refused.body)).toBe(409)
    expect(refused.body.error.code).toBe('image_limit_reached')
    expect(refused.body.error.message).toMatch(/--max-images-per-tenant 1/)
    // Nothing pulled, nothing staged, no agent recorded.
    const images = (await t.api.call('GET', '/v1/images')).body.data as { key: string }[]
    expect(images.map((image) => image.key)).toEqual([first.imageKey])
    expect(readdirSync(path.join(t.server.runtime.pool.root, 'staging'))).toEqual([])
    expect((await t.api.call('GET', '/v1/agents/second')).status).toBe(404)
    // The tenant's usage says what it holds and may hold.
    expect((await t.api.call('GET', '/v1/usage')).body.images).toEqual({ count: 1, maxImages: 1 })
    // Another tenant pulls and runs the image tenant A was refused.
    const b = await tenantApi('tenant-images-b')
    const theirs = await deployReady(b, 'second', SECOND)
    const session = await b.createSession('second')
    expect((await b.send(session.id, 'hello')).text).toBe('marker: built by the OCI test, root: image\n')
    expect(theirs.imageKey).not.toBe(first.imageKey)
  })

  it('two concurrent deploys of distinct images by a fresh tenant: one is refused', async () => {
    const c = await tenantApi('tenant-images-c')
    const answers = await Promise.all([
      c.deploy(await ociAgent('one', FIRST)),
      c.deploy(await ociAgent('two', SECOND)),
    ])
    expect(answers.map((res) => res.status).sort()).toEqual([201, 409])
    expect(answers.find((res) => res.status === 409)?.body.error.code).toBe('image_limit_reached')
  })
})
