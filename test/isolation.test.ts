import { spawnSync } from 'node:child_process'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject } from './helpers/projects.js'
import { startTestServer, type TestServer } from './helpers/server.js'

let t: TestServer
let gvisor: { available: boolean; reason?: string } | undefined

beforeAll(async () => {
  t = await startTestServer()
  const drivers = (await t.api.call('GET', '/v1/runtime')).body.drivers as {
    name: string
    available: boolean
    reason?: string
  }[]
  gvisor = drivers.find((d) => d.name === 'gvisor')
  for (const isolation of ['bwrap', 'gvisor']) {
    const project = await makeProject({
      'cairn.yaml': `name: where-${isolation}\ncommand: bash agent.sh\nisolation: ${isolation}\n`,
      'agent.sh':
        'while IFS= read -r l; do echo "$l" >> log.txt; dmesg >/dev/null 2>&1 && echo "kernel=host" || echo "kernel=$(uname -r)"; wc -l < log.txt; done\n',
    })
    expect((await t.api.deploy(project)).status).toBe(201)
  }
})

afterAll(async () => {
  await t?.close()
})

describe('isolation per agent', () => {
  it('lists the drivers with their capabilities', async () => {
    const res = await t.api.call('GET', '/v1/runtime')
    const bwrap = res.body.drivers.find((d: { name: string }) => d.name === 'bwrap')
    expect(bwrap).toMatchObject({
      default: true,
      available: true,
      capabilities: { freeze: true, transparentEgress: true },
    })
    expect(gvisor).toBeDefined()
    // gVisor's own network stack has no nftables: its egress stays on the proxy variables.
    const listed = res.body.drivers.find((d: { name: string }) => d.name === 'gvisor')
    expect(listed.capabilities.transparentEgress).toBe(false)
    // Pausing with memory: gVisor checkpoints; bwrap cannot (CRIU), and says why.
    expect(listed.capabilities.memorySnapshot).toBe(true)
    expect(bwrap.capabilities.memorySnapshot).toBe(false)
    expect(bwrap.capabilityReasons.memorySnapshot).toMatch(/CRIU.*root mapped.*isolation: gvisor/s)
  })

  it("names gVisor's platform: systrap where the installed runsc offers it, else ptrace", async (ctx) => {
    if (!gvisor?.available) ctx.skip()
    // runsc prints its flags on stderr.
    const flags = spawnSync(process.env.CAIRN_RUNSC ?? 'runsc', ['flags'], { encoding: 'utf8' }).stderr
    const listed = (await t.api.call('GET', '/v1/runtime')).body.drivers.find(
      (d: { name: string }) => d.name === 'gvisor',
    )
    expect(listed.platform).toBe(/which platform to use: [^.]*systrap/.test(flags) ? 'systrap' : 'ptrace')
    expect(listed.platformReason).toBeUndefined()
    expect(listed.description).toContain(`${listed.platform} platform`)
  })

  it('runs an agent that asks for gVisor under gVisor, with the same workspace semantics', async (ctx) => {
    if (!gvisor?.available) ctx.skip()
    const { id } = await t.api.createSession('where-gvisor')
    const first = await t.api.send(id, 'one')
    expect(first.terminal?.type, JSON.stringify(first.events)).toBe('run.completed')
    expect((await t.api.send(id, 'two')).text).toMatch(/2\n$/)
    const manifest = await t.api.call('GET', `/v1/sessions/${id}/manifest`)
    expect(manifest.body.driver).toBe('gvisor')
    const bwrap = await t.api.createSession('where-bwrap')
    expect((await t.api.send(bwrap.id, 'one')).text).toMatch(/1\n$/)
    expect((await t.api.call('GET', `/v1/sessions/${bwrap.id}/manifest`)).body.driver).toBe('bwrap')
  })
})
