import { type ChildProcess, execFileSync, spawn } from 'node:child_process'
import { copyFileSync, mkdirSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createNetnsHost, type NetnsHost, netnsAddresses } from './helpers/netns.js'
import { makeProject } from './helpers/projects.js'
import { scratchDir } from './helpers/scratch.js'
import { startTestServer, type TestServer } from './helpers/server.js'

// A real registry (Debian's docker-registry) on a test host in its own network namespace, holding
// an image this file builds with umoci and pushes with skopeo. The server pulls it through the
// egress proxy, which the operator lets reach that private address.
const SUBNET = 239
const { address: REGISTRY_HOST } = netnsAddresses(SUBNET)
const REFERENCE = `${REGISTRY_HOST}:5000/team/base:1.4`
let netnsHost: NetnsHost | undefined
const registries: ChildProcess[] = []
let loopbackPort = 0
let pushedDigest = ''
let t: TestServer

const run = (file: string, ...args: string[]) => execFileSync(file, args, { stdio: 'pipe' }).toString()

/** Starts docker-registry on `addr` (inside the test host's namespace when `host` is given) and waits for it. */
async function startRegistry(storage: string, addr: string, host?: NetnsHost): Promise<void> {
  const config = path.join(storage, `config-${registries.length}.yml`)
  writeFileSync(
    config,
    `version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: ${storage}/data\nhttp:\n  addr: ${addr}\n`,
  )
  const argv = ['docker-registry', 'serve', config]
  registries.push(
    host ? host.spawn(argv, { stdio: 'ignore' }) : spawn(argv[0] ?? '', argv.slice(1), { stdio: 'ignore' }),
  )
  for (let i = 0; i < 100; i++) {
    try {
      await fetch(`http://${addr}/v2/`)
      return
    } catch {
      await new Promise((r) => setTimeout(r, 100))
    }
  }
  throw new Error(`registry on ${addr} did not start`)
}

/** An image of a few files: dash (and the two libraries it needs), a marker and the agent's script. */
function buildImage(dir: string): string {
  const layout = path.join(dir, 'layout')
  const bundle = path.join(dir, 'bundle')
  run('umoci', 'init', '--layout', layout)
  run('umoci', 'new', '--image', `${layout}:1.4`)
  run('umoci', 'unpack', '--image', `${layout}:1.4`, bundle)
  const rootfs = path.join(bundle, 'rootfs')
  for (const [from, to] of [
    ['/usr/bin/dash', 'bin/sh'],
    ['/lib/x86_64-linux-gnu/libc.so.6', 'lib/x86_64-linux-gnu/libc.so.6'],
    ['/lib64/ld-linux-x86-64.so.2', 'lib64/ld-linux-x86-64.so.2'],
  ] as const) {
    mkdirSync(path.dirname(path.join(rootfs, to)), { recursive: true })
    copyFileSync(from, path.join(rootfs, to))
  }
  execFileSync('chmod', ['755', path.join(rootfs, 'bin/sh')])
  mkdirSync(path.join(rootfs, 'etc'), { recursive: true })
  writeFileSync(path.join(rootfs, 'etc/cairn-marker'), 'built by the OCI test\n')
  // exec protocol: the prompt on stdin, the reply on stdout. Builtins only (the image has no coreutils).
  writeFileSync(
    path.join(rootfs, 'agent.sh'),
    [
      'read -r prompt',
      'read -r marker < /etc/cairn-marker',
      'case "$prompt" in',
      '  write) echo written > /etc/note && echo "wrote /etc/note";;',
      '  read) if [ -e /etc/note ]; then echo "note present"; else echo "no note"; fi;;',
      '  *) if [ -e /usr/bin/python3 ]; then h=host; else h=image; fi; echo "marker: $marker, root: $h";;',
      'esac',
      '',
    ].join('\n'),
  )
  run('umoci', 'repack', '--image', `${layout}:1.4`, bundle)
  return layout
}

beforeAll(async () => {
  netnsHost = createNetnsHost('oci', SUBNET)
  const storage = await scratchDir('cairn-registry-')
  await startRegistry(storage, `${REGISTRY_HOST}:5000`, netnsHost)
  const layout = buildImage(await scratchDir('cairn-oci-'))
  run('skopeo', 'copy', '--quiet', '--dest-tls-verify=false', `oci:${layout}:1.4`, `docker://${REFERENCE}`)
  pushedDigest = run(
    'skopeo',
    'inspect',
    '--tls-verify=false',
    '--format',
    '{{.Digest}}',
    `docker://${REFERENCE}`,
  ).trim()
  // The same registry storage served on the host's loopback too: an image reference must not reach it.
  loopbackPort = 20000 + (process.pid % 20000)
  await startRegistry(storage, `127.0.0.1:${loopbackPort}`)
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

const ociAgent = (name: string, image: string) =>
  makeProject({
    'cairn.yaml': `name: ${name}\ncommand: [/bin/sh, /agent.sh]\nprotocol: exec\nimage: ${image}\n`,
  })

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

  it("refuses a reference on the host's loopback: pulls go out through the egress proxy only", async () => {
    const res = await t.api.deploy(await ociAgent('ssrf', `127.0.0.1:${loopbackPort}/team/base:1.4`))
    expect(res.status).toBe(422)
    expect(res.body.error.code).toBe('build_failed')
    expect(res.body.error.message).toMatch(/skopeo inspect/)
    // The registry there holds the image: only the wall kept the server from pulling it.
    expect(
      run(
        'skopeo',
        'inspect',
        '--tls-verify=false',
        '--format',
        '{{.Digest}}',
        `docker://127.0.0.1:${loopbackPort}/team/base:1.4`,
      ).trim(),
    ).toBe(pushedDigest)
  })

  it('collects an image no revision uses once its agents are deleted', async () => {
    for (const name of ['oci', 'oci-again'])
      expect((await t.api.call('DELETE', `/v1/agents/${name}`)).status).toBe(200)
    await t.server.images.collect()
    expect((await t.api.call('GET', '/v1/images')).body.data).toEqual([])
  })
})
