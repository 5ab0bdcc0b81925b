import { execFileSync } from 'node:child_process'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject, SHELL_AGENT } from './helpers/projects.js'
import { startTestServer, type TestServer } from './helpers/server.js'

// One image of another Debian release than the host's (trixie: Python 3.13; the host and bookworm
// have 3.11), built once from this host's mirror with the keyring Debian 12 ships (it holds
// trixie's keys). Agents with and without it report the Python they run on.
const IMAGE_YAML = 'image: debian:trixie\npackages: [python3]\n'
const PYTHON_AGENT = [
  'import sys',
  'while True:',
  '    line = input()',
  '    print(line, sys.version.split()[0])',
].join('\n')

let t: TestServer

async function waitReady(
  agent: string,
  timeoutMs = 240_000,
): Promise<{ status: string; error: string | null }> {
  const until = Date.now() + timeoutMs
  for (;;) {
    const res = await t.api.call('GET', `/v1/agents/${agent}`)
    const revision = res.body.revisions?.[0]
    if (revision && revision.status !== 'DEPLOYING') return revision
    if (Date.now() > until) throw new Error(`revision of ${agent} still DEPLOYING`)
    await new Promise((r) => setTimeout(r, 500))
  }
}

async function deploy(name: string, files: Record<string, string>): Promise<void> {
  const deployed = await t.api.deploy(await makeProject(files))
  expect(deployed.status, JSON.stringify(deployed.body)).toBe(201)
  const revision = await waitReady(name)
  expect(revision.status, revision.error ?? '').toBe('READY')
}

async function turn(agent: string, line: string): Promise<string> {
  const session = await t.api.createSession(agent)
  const reply = await t.api.send(session.id, line)
  expect(reply.terminal?.type, JSON.stringify(reply.events.slice(-3))).toBe('run.completed')
  return reply.text
}

beforeAll(async () => {
  t = await startTestServer({ server: { defaultImage: 'host' } })
  await deploy('py-trixie', {
    'cairn.yaml': `name: py-trixie\ncommand: python3 agent.py\n${IMAGE_YAML}`,
    'agent.py': PYTHON_AGENT,
  })
}, 300_000)

afterAll(async () => {
  await t?.close()
})

describe('an image of another Debian release', () => {
  it("runs the agent on the image's Python, not the host's", async () => {
    await deploy('py-host', {
      'cairn.yaml': 'name: py-host\ncommand: python3 agent.py\n',
      'agent.py': PYTHON_AGENT,
    })
    const hostVersion = execFileSync('/usr/bin/python3', ['-c', 'import sys; print(sys.version.split()[0])'])
      .toString()
      .trim()
    expect(await turn('py-host', 'python')).toBe(`python ${hostVersion}\n`)
    const imageReply = await turn('py-trixie', 'python')
    expect(imageReply).toMatch(/^python 3\.13\.\d+\n$/)
    expect(imageReply).not.toBe(`python ${hostVersion}\n`)
  })

  it('lists ls -l and stat under gVisor on the image (coreutils 9 statx on an old runsc)', async (ctx) => {
    const drivers = (await t.api.call('GET', '/v1/runtime')).body.drivers as {
      name: string
      available: boolean
    }[]
    if (!drivers.find((d) => d.name === 'gvisor')?.available) ctx.skip()
    // Same recipe: the image built above, no second build.
    await deploy('trixie-gvisor', {
      'cairn.yaml': `name: trixie-gvisor\ncommand: bash agent.sh\nisolation: gvisor\n${IMAGE_YAML}`,
      'agent.sh': SHELL_AGENT,
    })
    const reply = await turn(
      'trixie-gvisor',
      '. /etc/os-release; echo "$VERSION_CODENAME"; ls -l / | grep " etc$"; stat -c "%n %a %U" /etc/os-release /usr/bin/python3',
    )
    expect(reply).toMatch(
      /^trixie\n[d-][rwx-]{9} +\d+ agent +agent +\d+ .* etc\n\/etc\/os-release \d+ agent\n\/usr\/bin\/python3 \d+ agent\n\[exit 0\]\n$/,
    )
  })
})
