import { writeFileSync } from 'node:fs'
import path from 'node:path'
import { type EgressBed, startEgressBed } from './egress-probe.js'
import { buildImage, pushImage, registries, startRegistry } from './oci-registry.js'
import { makeProject, ociAgent } from './projects.js'
import { scratchDir } from './scratch.js'
import { Api, startTestServer, type TestServer } from './server.js'
import { type SlowTurn, slowTurn } from './slow-client.js'

/**
 * Issue 28's bed of two tenants on one server (test/security/tenant-at-limits.test.ts asserts
 * what it shows, bench/tenant-at-limits.ts measures its latency): `hostile` and `other`, each
 * with a `probe` agent that drives its sandbox's egress (an egress test bed, a DNS server that
 * never answers some names), `hostile` with an OCI image agent (its allowance: one image) and a
 * `flooder`. `attack` puts the hostile tenant at every limit at once.
 */
export const HOSTILE_TENANT_MIB = 48
export const HOSTILE_MAX_CONNECTIONS = 16
export const HOSTILE_MAX_LOOKUPS = 8
const MiB = 1024 * 1024

export interface HostileBed {
  egress: EgressBed
  server: TestServer
  hostile: Api
  other: Api
  close(): Promise<void>
}

/** Everything the hostile tenant did once each part met its limit; `flood` still runs. */
export interface AttackOutcome {
  hoard: string
  lookups: string
  fill: number | string
  logs: (number | string)[]
  image: number
  saves: (number | string)[]
  flood: SlowTurn
  flooded: string
}

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
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

function check(holds: boolean, what: string): void {
  if (!holds) throw new Error(what)
}

async function tenantApi(server: TestServer, tenant: string): Promise<Api> {
  const key = await server.api.call('POST', '/v1/keys', { tenant, role: 'admin' })
  check(key.status === 201, `key for ${tenant}: ${key.status} ${JSON.stringify(key.body)}`)
  return new Api(server.url, key.body.key)
}

async function deployReady(api: Api, dir: string): Promise<void> {
  const res = await api.deploy(dir)
  check(res.status === 201, `deploy: ${res.status} ${JSON.stringify(res.body)}`)
  const name = res.body.agent?.name ?? res.body.name
  let revision = res.body.revision
  for (let i = 0; i < 200 && revision?.status === 'DEPLOYING'; i++) {
    await sleep(100)
    revision = (await api.call('GET', `/v1/agents/${name}`)).body.revisions[0]
  }
  check(revision?.status === 'READY', `${name}: ${revision?.status} ${revision?.error ?? ''}`)
}

/** The bed, on the egress bed's `subnet` (one per concurrent user of `tag`); ~15 s. */
export async function startHostileBed(tag: string, subnet: number): Promise<HostileBed> {
  const egress = await startEgressBed(tag, subnet)
  const registry = `${egress.address}:5000`
  await startRegistry(await scratchDir('cairn-registry-'), registry, egress.host)
  pushImage(buildImage(await scratchDir('cairn-oci-')), `${registry}/team/first:1`)
  const another = (rootfs: string) => writeFileSync(path.join(rootfs, 'etc/other'), 'a second image\n')
  pushImage(buildImage(await scratchDir('cairn-oci-'), another), `${registry}/team/second:1`)
  const server = await startTestServer({
    server: {
      tenantQuotaMiB: HOSTILE_TENANT_MIB,
      workspaceQuotaMiB: 0,
      rateLimitPerSecond: 0,
      maxImagesPerTenant: 1,
      egressPrivateExceptions: [egress.address],
      egressLimits: {
        maxConnections: HOSTILE_MAX_CONNECTIONS,
        maxLookups: HOSTILE_MAX_LOOKUPS,
        lookupTimeoutMs: 15_000,
        dnsServers: [egress.dnsServer],
      },
    },
  })
  const close = async () => {
    await server.close()
    for (const r of registries) r.kill('SIGKILL')
    egress.close()
  }
  try {
    const hostile = await tenantApi(server, 'hostile')
    const other = await tenantApi(server, 'other')
    await deployReady(hostile, await ociAgent('first', `${registry}/team/first:1`))
    for (const api of [hostile, other]) await deployReady(api, await makeProject(PROBE(egress)))
    await deployReady(hostile, await makeProject(FLOODER))
    return { egress, server, hostile, other, close }
  } catch (error) {
    await close()
    throw error
  }
}

/** The reply of one turn, trimmed. */
export const send = async (api: Api, id: string, line: string) => (await api.send(id, line)).text.trim()

/** A warm session of the other tenant's probe, allowed to reach the egress bed's fast name and host. */
export async function otherSession(b: HostileBed): Promise<string> {
  const { egress } = b
  const network = { allow: [`${egress.fastName}:8443`, `${egress.address}:8080`] }
  const { id } = await b.other.createSession('probe', { network })
  check((await send(b.other, id, 'echo warm')) === 'warm', 'the first turn did not answer')
  return id
}

/** How long each of `count` warm turns of the other tenant's session `id` took, in ms (each answer checked). */
export async function otherTurnsMs(b: HostileBed, id: string, count: number): Promise<number[]> {
  const took: number[] = []
  for (let i = 0; i < count; i++) {
    const started = performance.now()
    const reply = await send(b.other, id, `echo ${i}`)
    took.push(performance.now() - started)
    check(reply === String(i), `turn ${i} answered ${JSON.stringify(reply)}`)
  }
  return took
}

/** Runs a command in the session and waits for its end; its start's status, or its refusal's code. */
async function command(api: Api, id: string, argv: string[]): Promise<number | string> {
  const started = await api.call('POST', `/v1/sessions/${id}/commands`, { command: argv })
  for (let n = 0; started.status === 201 && n < 200; n++) {
    const got = await api.call('GET', `/v1/sessions/${id}/commands/${started.body.id}`)
    if (got.body.status !== 'running') break
    await sleep(50)
  }
  return started.body.error?.code ?? started.status
}

/** A session's commands, one after another (a session runs one at a time), each writing 8 MiB of log. */
async function fillLogs(api: Api, id: string): Promise<(number | string)[]> {
  const codes: (number | string)[] = []
  for (let i = 0; i < 3; i++) codes.push(await command(api, id, ['head', '-c', String(8 * MiB), '/dev/zero']))
  return codes
}

/**
 * Everything the hostile tenant does, until it holds every limit at once: tunnels hoarded past its
 * sandbox's cap and lookups that never answer past theirs, then together its quota filled by a
 * workspace, command logs and artifacts, a second image past its allowance, a flooding agent whose
 * stream nobody reads. Resolves when each has met its limit; the flood goes on until
 * `flood.stop()` and the session's cancel.
 */
export async function attack(b: HostileBed): Promise<AttackOutcome> {
  const { hostile, egress } = b
  const network = { allow: [`${egress.address}:8443`, `*.${egress.slow}:8443`] }
  const hoarder = (await hostile.createSession('probe', { network })).id
  const asker = (await hostile.createSession('probe', { network })).id
  const disk = (await hostile.createSession('probe')).id
  const logs = (await hostile.createSession('probe')).id
  const flooded = (await hostile.createSession('flooder')).id
  // The tunnels and lookups first: they stay held once their turns end, and a turn that ended
  // after the fills would meet the tenant's full budget (its events refused, its reply empty).
  const [hoard, lookups] = await Promise.all([
    send(hostile, hoarder, `hoard ${HOSTILE_MAX_CONNECTIONS + 4} ${egress.address}:8443`),
    send(hostile, asker, `flood ${HOSTILE_MAX_LOOKUPS + 4}`),
  ])
  const flood = slowTurn({ url: b.server.url, key: hostile.key }, flooded, 0)
  const fillCommand = `truncate -s ${HOSTILE_TENANT_MIB}M /workspace/sparse; dd if=/dev/zero of=/workspace/fill bs=1M count=${HOSTILE_TENANT_MIB} 2>&1 | tail -1`
  const [fill, logCodes, image] = await Promise.all([
    command(hostile, disk, ['sh', '-c', fillCommand]),
    fillLogs(hostile, logs),
    hostile.deploy(await ociAgent('second', `${egress.address}:5000/team/second:1`)),
  ])
  const saves = await Promise.all(
    [1, 2, 3].map(() => hostile.call('POST', `/v1/sessions/${disk}/artifacts`, { path: 'sparse' })),
  )
  const codes = saves.map((s) => s.body.error?.code ?? s.status)
  return { hoard, lookups, fill, logs: logCodes, image: image.status, saves: codes, flood, flooded }
}

/** Stops the flood `attack` started. */
export async function stopFlood(b: HostileBed, done: AttackOutcome): Promise<void> {
  done.flood.stop()
  await b.hostile.call('POST', `/v1/sessions/${done.flooded}/cancel`)
}
