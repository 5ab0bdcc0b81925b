import { execFileSync } from 'node:child_process'
import { lstatSync, mkdirSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { readFile } from 'node:fs/promises'
import path from 'node:path'
import { ImageStore } from '@cairn/runtime'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createNetnsHost, type NetnsHost, netnsAddresses } from '../helpers/netns.js'
import { buildImage, imageDigest, pushImage, registries, startRegistry } from '../helpers/oci-registry.js'
import { ociAgent } from '../helpers/projects.js'
import { scratchDir } from '../helpers/scratch.js'
import { Api, startTestServer, type TestServer } from '../helpers/server.js'

// Attacks on agent images: an image reference aimed at the host's loopback, and a sandbox that
// rewrites its (writable) root hoping the next sandbox, or another session, runs what it wrote.
const SUBNET = 240
const { address: REGISTRY_HOST } = netnsAddresses(SUBNET)
const REFERENCE = `${REGISTRY_HOST}:5000/team/base:1.4`
let netnsHost: NetnsHost | undefined
let loopbackPort = 0
let digest = ''
let t: TestServer

beforeAll(async () => {
  netnsHost = createNetnsHost('oimg', SUBNET)
  const storage = await scratchDir('cairn-registry-')
  await startRegistry(storage, `${REGISTRY_HOST}:5000`, netnsHost)
  const layout = buildImage(await scratchDir('cairn-oci-'))
  pushImage(layout, REFERENCE)
  digest = imageDigest(REFERENCE)
  // The same storage served on the host's loopback: a registry only the host itself reaches.
  loopbackPort = 20000 + (process.pid % 20000)
  await startRegistry(storage, `127.0.0.1:${loopbackPort}`)
  t = await startTestServer({ server: { egressPrivateExceptions: [REGISTRY_HOST] } })
}, 120_000)

afterAll(async () => {
  await t?.close()
  for (const registry of registries) registry.kill('SIGKILL')
  netnsHost?.remove()
})

describe('image attacks', () => {
  it("refuses a reference on the host's loopback: pulls go out through the egress proxy only", async () => {
    const res = await t.api.deploy(await ociAgent('ssrf', `127.0.0.1:${loopbackPort}/team/base:1.4`))
    expect(res.status).toBe(422)
    expect(res.body.error.code).toBe('build_failed')
    expect(res.body.error.message).toMatch(/skopeo inspect/)
    // The registry there holds the image: only the wall kept the server from pulling it.
    const there = imageDigest(`127.0.0.1:${loopbackPort}/team/base:1.4`)
    expect(there).toBe(digest)
    expect((await t.api.call('GET', '/v1/agents')).body.data).toEqual([])
  })

  it('a sandbox that rewrites its root changes neither the image nor any other sandbox', async () => {
    const deployed = await t.api.deploy(await ociAgent('tamper', REFERENCE))
    expect(deployed.status, JSON.stringify(deployed.body)).toBe(201)
    for (let i = 0; i < 200; i++) {
      const res = await t.api.call('GET', '/v1/agents/tamper')
      if (res.body.revisions[0].status !== 'DEPLOYING') break
      await new Promise((r) => setTimeout(r, 250))
    }
    const a = await t.api.createSession('tamper')
    const b = await t.api.createSession('tamper')
    // The root is writable inside: the agent replaces its own script and the image's marker.
    expect((await t.api.send(a.id, 'tamper')).text).toBe('tampered\n')
    // The next sandbox (exec: one per turn) of the same session, and another session, run the image as built.
    expect((await t.api.send(a.id, 'hello')).text).toBe('marker: built by the OCI test, root: image\n')
    expect((await t.api.send(b.id, 'hello')).text).toBe('marker: built by the OCI test, root: image\n')
    const key = `oci-${digest.slice('sha256:'.length)}`
    const rootfs = new ImageStore(t.server.runtime.pool).rootfsPath(key)
    expect(await readFile(path.join(rootfs, 'etc/cairn-marker'), 'utf8')).toBe('built by the OCI test\n')
    expect(await readFile(path.join(rootfs, 'agent.sh'), 'utf8')).toMatch(/^read -r prompt\n/)
  })

  it("an image's symlinks (etc -> a host directory) do not carry the root-run preparation out of it", async () => {
    // The image is made a sandbox root as root on the host: written files, mount points and removed
    // markers must land in the image even when its `etc`, `opt` or `usr/lib` point elsewhere.
    const victim = await scratchDir('cairn-images-victim-')
    for (const dir of ['etc', 'opt', 'lib/python3']) mkdirSync(path.join(victim, dir), { recursive: true })
    writeFileSync(path.join(victim, 'lib/python3/EXTERNALLY-MANAGED'), 'kept\n')
    const layout = buildImage(await scratchDir('cairn-oci-'), (rootfs) => {
      rmSync(path.join(rootfs, 'etc'), { recursive: true })
      symlinkSync(path.join(victim, 'etc'), path.join(rootfs, 'etc'))
      symlinkSync(path.join(victim, 'opt'), path.join(rootfs, 'opt'))
      mkdirSync(path.join(rootfs, 'usr'))
      symlinkSync(path.join(victim, 'lib'), path.join(rootfs, 'usr/lib'))
    })
    const evil = `${REGISTRY_HOST}:5000/team/evil:1`
    pushImage(layout, evil)
    const deployed = await t.api.deploy(await ociAgent('symlinked', evil))
    expect(deployed.status, JSON.stringify(deployed.body)).toBe(201)
    let revision: { status: string; error: string | null; imageKey: string } = deployed.body.revision
    for (let i = 0; i < 200 && revision.status === 'DEPLOYING'; i++) {
      await new Promise((r) => setTimeout(r, 250))
      revision = (await t.api.call('GET', '/v1/agents/symlinked')).body.revisions[0]
    }
    expect(revision.status, revision.error ?? '').toBe('READY')
    // Nothing written, made or removed through the links.
    expect(readdirSync(path.join(victim, 'etc'))).toEqual([])
    expect(readdirSync(path.join(victim, 'opt'))).toEqual([])
    expect(readFileSync(path.join(victim, 'lib/python3/EXTERNALLY-MANAGED'), 'utf8')).toBe('kept\n')
    // The image got real directories in their place, with the generated files.
    const rootfs = new ImageStore(t.server.runtime.pool).rootfsPath(revision.imageKey)
    expect(lstatSync(path.join(rootfs, 'etc')).isDirectory()).toBe(true)
    expect(readFileSync(path.join(rootfs, 'etc/passwd'), 'utf8')).toMatch(/^root:/)
    expect(lstatSync(path.join(rootfs, 'opt/cairn')).isDirectory()).toBe(true)
  })

  it("tenant B neither sees tenant A's image nor runs it by naming its digest where B's registry lacks it", async () => {
    // Images are shared by key (an OCI image's is its digest). Tenant A pulls its private image; B
    // reads the node's image list for its source and digest, then names that digest on a repository
    // that does not hold it: reusing A's pulled root would hand B A's files without a pull.
    const deployed = await t.api.deploy(await ociAgent('private', REFERENCE))
    expect(deployed.status, JSON.stringify(deployed.body)).toBe(201)
    let revision: { status: string; error: string | null } = deployed.body.revision
    for (let i = 0; i < 200 && revision.status === 'DEPLOYING'; i++) {
      await new Promise((r) => setTimeout(r, 250))
      revision = (await t.api.call('GET', '/v1/agents/private')).body.revisions[0]
    }
    expect(revision.status, revision.error ?? '').toBe('READY')
    const keyB = await t.api.call('POST', '/v1/keys', { tenant: 'tenant-images-b', role: 'admin' })
    expect(keyB.status).toBe(201)
    const b = new Api(t.url, keyB.body.key)
    const listed = (await b.call('GET', '/v1/images')).body.data as { source: string; digest: string }[]
    expect(listed.filter((image) => image.digest === digest || image.source === REFERENCE)).toEqual([])
    const stolen = await b.deploy(
      await ociAgent('stolen', `${REGISTRY_HOST}:5000/tenant-b/nothing@${digest}`),
    )
    let theirs: { status: string; error: string | null } = stolen.body.revision ?? {
      status: 'FAILED',
      error: null,
    }
    for (let i = 0; i < 200 && stolen.status === 201 && theirs.status === 'DEPLOYING'; i++) {
      await new Promise((r) => setTimeout(r, 250))
      theirs = (await b.call('GET', '/v1/agents/stolen')).body.revisions[0]
    }
    expect(theirs.status).not.toBe('READY')
  })

  it("refuses an image larger than the operator's maximum, keeping nothing of it", async () => {
    // Images are shared and outside every tenant's quota: their size is capped instead.
    const small = await startTestServer({
      server: { egressPrivateExceptions: [REGISTRY_HOST], maxImageMiB: 1 },
    })
    try {
      // Its layers (dash and libc, about 2 MiB) are declared above the cap: refused before the pull.
      const res = await small.api.deploy(await ociAgent('big', REFERENCE))
      expect(res.status, JSON.stringify(res.body)).toBe(422)
      expect(res.body.error.code).toBe('image_too_large')
      expect(res.body.error.message).toMatch(/the operator's maximum image size of 1\.0 MiB/)
      expect((await small.api.call('GET', '/v1/images')).body.data).toEqual([])
    } finally {
      await small.close()
    }
  })

  it('refuses a layer that unpacks past the maximum before writing it: a few MiB pulled never fill the pool', async () => {
    // 256 MiB of zeros gzip to about 256 KiB: the pull is small, the unpacked root is not, and the
    // size was measured only once the root was on disk.
    const zeros = 'zero.bin'
    const layout = buildImage(await scratchDir('cairn-oci-'), (rootfs) => {
      execFileSync('truncate', ['-s', '256M', path.join(rootfs, zeros)])
    })
    const bomb = `${REGISTRY_HOST}:5000/team/bomb:1`
    pushImage(layout, bomb)
    const capped = await startTestServer({
      server: { egressPrivateExceptions: [REGISTRY_HOST], maxImageMiB: 8 },
    })
    try {
      const staging = capped.server.runtime.pool.areaDir('staging')
      let peakBytes = 0
      const watch = setInterval(() => {
        for (const name of readdirSync(staging, { withFileTypes: true }))
          if (name.name.startsWith('imagepull_')) {
            const size = lstatSync(path.join(staging, name.name, 'rootfs', zeros), {
              throwIfNoEntry: false,
            })?.size
            peakBytes = Math.max(peakBytes, size ?? 0)
          }
      }, 2)
      expect((await capped.api.deploy(await ociAgent('bomb', bomb))).status).toBe(201)
      let revision: { status: string; error: string | null } = { status: 'DEPLOYING', error: null }
      for (let i = 0; i < 400 && revision.status === 'DEPLOYING'; i++) {
        await new Promise((r) => setTimeout(r, 100))
        revision = (await capped.api.call('GET', '/v1/agents/bomb')).body.revisions[0]
      }
      clearInterval(watch)
      expect(revision.status).toBe('FAILED')
      expect(revision.error).toMatch(/the operator's maximum of 8\.0 MiB/)
      expect(peakBytes).toBeLessThanOrEqual(8 * 1024 * 1024)
    } finally {
      await capped.close()
    }
  })
})
