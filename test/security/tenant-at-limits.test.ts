import { writeFileSync } from 'node:fs'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type EgressBed, startEgressBed } from '../helpers/egress-probe.js'
import { buildImage, pushImage, registries, startRegistry } from '../helpers/oci-registry.js'
import { makeProject, ociAgent } from '../helpers/projects.js'
import { scratchDir } from '../helpers/scratch.js'
import { Api, startTestServer, type TestServer } from '../helpers/server.js'
import { slowTurn } from '../helpers/slow-client.js'

// Issue 28, "what it must show": one tenant at every limit at once (its storage quota filled by
// its pool, artifacts and command logs; one image past its allowance; an agent flooding its
// stream; one hoarding egress tunnels; one asking names DNS never answers) leaves the server up
// and another tenant's writes, turns and egress as they were: each of its warm turns still answered,
// within TURN_BOUND_MS (a liveness bound, ~100x a warm turn here: a starved tenant's turn would wait
// on the hostile one's work). The latency ratio (within 2x of idle, the figure) is speed, so
// it is measured in bench/tenant-at-limits.ts, not asserted here; this test logs it. One server, one egress test bed, one registry: ~25 s, most of it the image's pull and
// the hostile tenant's fills; left out of the PostgreSQL pass (nothing here is the database's).
const SUBNET = 237
const TENANT_MIB = 48
const MiB = 1024 * 1024
const MAX_CONNECTIONS = 16
const MAX_LOOKUPS = 8
const TURNS_MEASURED = 7
const TURN_BOUND_MS = 5_000
let bed: EgressBed
let t: TestServer
let hostile: Api
let other: Api
let secondImage = ''

const PROBE = (bed: EgressBed) => ({
  'cairn.yaml': 'name: probe\ncommand: python3 probe.py\n',
  'probe.py': bed.probe,
})
/** A jsonl agent that answers every message with tool frames, as fast as it can, and never ends. */
const FLOODER = {
  'cairn.yaml': 'name: flooder\ncommand: python3 flood.py\nprotocol: jsonl\n',
  'flood.py': [
    'import json, sys',
    'frame = json.dumps({"type": "tool.start", "id": "t", "name": "flood", "input": {"pad": "x" * 4000}}) + "\\n"',
    'for line in sys.stdin:',
    '    while True:',
    '        sys.stdout.write(frame * 50)',
  ].join('\n'),
}

async function tenantApi(tenant: string): Promise<Api> {
  const key = await t.api.call('POST', '/v1/keys', { tenant, role: 'admin' })
  expect(key.status).toBe(201)
  return new Api(t.url, key.body.key)
}

async function deployReady(api: Api, dir: string): Promise<void> {
  const res = await api.deploy(dir)
  expect(res.status, JSON.stringify(res.body)).toBe(201)
  const name = res.body.agent?.name ?? res.body.name
  let revision = res.body.revision
  for (let i = 0; i < 200 && revision?.status === 'DEPLOYING'; i++) {
    await new Promise((r) => setTimeout(r, 100))
    revision = (await api.call('GET', `/v1/agents/${name}`)).body.revisions[0]
  }
  expect(revision?.status, revision?.error ?? '').toBe('READY')
}

beforeAll(async () => {
  bed = await startEgressBed('tlim', SUBNET)
  const registry = `${bed.address}:5000`
  await startRegistry(await scratchDir('cairn-registry-'), registry, bed.host)
  pushImage(buildImage(await scratchDir('cairn-oci-')), `${registry}/team/first:1`)
  const another = (rootfs: string) => writeFileSync(path.join(rootfs, 'etc/other'), 'a second image\n')
  secondImage = `${registry}/team/second:1`
  pushImage(buildImage(await scratchDir('cairn-oci-'), another), secondImage)
  t = await startTestServer({
    server: {
      tenantQuotaMiB: TENANT_MIB,
      workspaceQuotaMiB: 0,
      rateLimitPerSecond: 0,
      maxImagesPerTenant: 1,
      egressPrivateExceptions: [bed.address],
      egressLimits: {
        maxConnections: MAX_CONNECTIONS,
        maxLookups: MAX_LOOKUPS,
        lookupTimeoutMs: 15_000,
        dnsServers: [bed.dnsServer],
      },
    },
  })
  hostile = await tenantApi('hostile')
  other = await tenantApi('other')
  await deployReady(hostile, await ociAgent('first', `${registry}/team/first:1`))
  for (const api of [hostile, other]) await deployReady(api, await makeProject(PROBE(bed)))
  await deployReady(hostile, await makeProject(FLOODER))
}, 120_000)

afterAll(async () => {
  await t?.close()
  for (const registry of registries) registry.kill('SIGKILL')
  bed?.close()
})

const send = async (api: Api, id: string, line: string) => (await api.send(id, line)).text.trim()

/** The median latency of `TURNS_MEASURED` warm turns of the other tenant, in ms; each within the bound. */
async function medianTurnMs(id: string): Promise<number> {
  const took: number[] = []
  for (let i = 0; i < TURNS_MEASURED; i++) {
    const started = performance.now()
    expect(await send(other, id, `echo ${i}`)).toBe(String(i))
    took.push(performance.now() - started)
  }
  expect(Math.max(...took)).toBeLessThan(TURN_BOUND_MS)
  return took.sort((a, b) => a - b)[Math.floor(TURNS_MEASURED / 2)] ?? Number.NaN
}

/** Runs a command in the session and waits for its end; its start's status, or its refusal's code. */
async function command(api: Api, id: string, argv: string[]): Promise<number | string> {
  const started = await api.call('POST', `/v1/sessions/${id}/commands`, { command: argv })
  for (let n = 0; started.status === 201 && n < 200; n++) {
    const got = await api.call('GET', `/v1/sessions/${id}/commands/${started.body.id}`)
    if (got.body.status !== 'running') break
    await new Promise((r) => setTimeout(r, 50))
  }
  return started.body.error?.code ?? started.status
}

/** Everything the hostile tenant does at once; resolves when each has met its limit. */
async function attack(): Promise<Record<string, unknown>> {
  const egress = { network: { allow: [`${bed.address}:8443`, `*.${bed.slow}:8443`] } }
  const hoarder = (await hostile.createSession('probe', egress)).id
  const asker = (await hostile.createSession('probe', egress)).id
  const disk = (await hostile.createSession('probe')).id
  const logs = (await hostile.createSession('probe')).id
  const flooded = (await hostile.createSession('flooder')).id
  const flood = slowTurn({ url: t.url, key: hostile.key }, flooded, 0)
  const [hoard, lookups, fill, logCommands, image] = await Promise.all([
    send(hostile, hoarder, `hoard ${MAX_CONNECTIONS + 4} ${bed.address}:8443`),
    send(hostile, asker, `flood ${MAX_LOOKUPS + 4}`),
    command(hostile, disk, [
      'sh',
      '-c',
      `truncate -s ${TENANT_MIB}M /workspace/sparse; dd if=/dev/zero of=/workspace/fill bs=1M count=${TENANT_MIB} 2>&1 | tail -1`,
    ]),
    (async () => {
      // A session runs one command at a time: the logs' commands, one after another.
      const codes: (number | string)[] = []
      for (let i = 0; i < 3; i++)
        codes.push(await command(hostile, logs, ['head', '-c', String(8 * MiB), '/dev/zero']))
      return codes
    })(),

    hostile.deploy(await ociAgent('second', secondImage)),
  ])
  const saves = await Promise.all(
    [1, 2, 3].map(() => hostile.call('POST', `/v1/sessions/${disk}/artifacts`, { path: 'sparse' })),
  )
  return {
    hoard,
    lookups,
    fill,
    logs: logCommands,
    image: image.status,
    saves: saves.map((s) => s.body.error?.code ?? s.status),
    flood,
    flooded,
  }
}

describe('a tenant at every limit at once', () => {
  it("leaves the server up and another tenant's writes, turns (each answered, none starved) and egress unaffected", async () => {
    const id = (
      await other.createSession('probe', {
        network: { allow: [`${bed.fastName}:8443`, `${bed.address}:8080`] },
      })
    ).id
    expect(await send(other, id, 'echo warm')).toBe('warm')
    const idleMs = await medianTurnMs(id)

    const done = await attack()
    const flood = done.flood as ReturnType<typeof slowTurn>
    try {
      expect(done.hoard).toBe(`200 x${MAX_CONNECTIONS} 429 x4`)
      expect(done.lookups).toBe('started')
      expect(done.image).toBe(409)
      for (const saved of done.saves as unknown[]) expect(saved).toBe('quota_exceeded')
      // Meanwhile: tunnels held, lookups unanswered, the tenant's storage at its quota.
      const loadedMs = await medianTurnMs(id)
      const written = await fetch(`${t.url}/v1/sessions/${id}/files/content?path=notes.txt`, {
        method: 'PUT',
        headers: { authorization: `Bearer ${other.key}`, 'content-type': 'application/octet-stream' },
        body: Buffer.alloc(MiB, 1),
      })
      expect(written.status).toBe(200)
      expect(await send(other, id, `connect ${bed.fastName}:8443`)).toBe(
        'HTTP/1.1 200 Connection Established',
      )
      expect(await send(other, id, `get http://${bed.address}:8080/x`)).toBe(
        `hello from the test host: ${bed.address}:8080 /x`,
      )
      expect((await t.api.call('GET', '/healthz')).status).toBe(200)
      const usage = (await hostile.call('GET', '/v1/usage')).body
      console.log(
        `[tenant-at-limits] other tenant's warm turn: ${idleMs.toFixed(0)} ms idle, ${loadedMs.toFixed(0)} ms beside the hostile one (x${(loadedMs / idleMs).toFixed(2)}); hostile: ${JSON.stringify({ ...done, flood: flood.received })}; its usage ${JSON.stringify(usage.quota)}`,
      )
      // The pool's group limit lets a write pass it by the kernel's accounting slack (16 KiB seen).
      expect(usage.quota.usedBytes).toBeLessThanOrEqual(TENANT_MIB * MiB + MiB)
      // The flooding agent's turn was stopped by its tenant's budget, not left to run.
      const floodedSession = (await hostile.call('GET', `/v1/sessions/${done.flooded}`)).body
      expect(floodedSession.statusCause).toBe('quota_exceeded')
    } finally {
      flood.stop()
      await hostile.call('POST', `/v1/sessions/${done.flooded}/cancel`)
    }
  })
})
