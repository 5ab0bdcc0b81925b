import { existsSync, statSync } from 'node:fs'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { networkInterfaces } from 'node:os'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { NetworkEvent } from '../../packages/runtime/src/egress/proxy.js'
import { GvisorDriver } from '../../packages/runtime/src/sandbox/gvisor-driver.js'
import { CONTAINED, ESCAPE_PROBE, parseProbeResults } from '../helpers/probe.js'
import {
  completedText,
  DRIVERS,
  gvisorLeftovers,
  instanceProcesses,
  liveSandboxCgroups,
  makeRevision,
  openTestRuntime,
  probeDrivers,
  reply,
  runOn,
  SANDBOX_UID,
  sandboxMounts,
  sessionId,
  startOn,
  type TestRuntime,
  turn,
  waitFor,
} from './harness.js'

const PROBE = `import socket, urllib.request
def get(url):
    try:
        return urllib.request.urlopen(url, timeout=5).read().decode().strip()
    except Exception as e:
        return "ERR " + type(e).__name__ + " " + str(e)[:60]
def raw(host, port):
    try:
        s = socket.create_connection((host, port), timeout=2)
        s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
        reply = s.recv(4096).decode(errors="replace")
        s.close()
        return reply.split("\\r\\n")[0] if reply else "ERR closed"
    except Exception as e:
        return "ERR " + type(e).__name__
while True:
    kind, _, arg = input().partition(" ")
    if kind == "get":
        print(get(arg))
    else:
        host, port = arg.rsplit(":", 1)
        print(raw(host, int(port)))
`

const drivers = await probeDrivers()
const hostAddress = Object.values(networkInterfaces())
  .flat()
  .find((a) => a && a.family === 'IPv4' && !a.internal)?.address
let t: TestRuntime
const servers: http.Server[] = []

async function serve(body: string, host: string): Promise<number> {
  const server = http.createServer((_req, res) => res.end(`${body}\n`))
  servers.push(server)
  await new Promise<void>((resolve) => server.listen(0, host, resolve))
  return (server.address() as AddressInfo).port
}

beforeAll(async () => {
  t = await openTestRuntime()
  await makeRevision(t.runtime, 'rev_box', { 'README.md': 'conformance\n', 'probe.py': PROBE })
})

afterAll(async () => {
  for (const server of servers) server.close()
  await t?.close()
})

describe.each(DRIVERS)('%s driver: sandbox', (isolation) => {
  const test = it.skipIf(!drivers[isolation].ok)
  let workspace = ''
  const inside = async (script: string, shell: 'bash' | 'python3' = 'bash') => {
    workspace ||= await t.runtime.pool.createWorkspace(sessionId('box'), 'rev_box')
    return completedText(await runOn(t.runtime, isolation, workspace, script, { shell }))
  }

  test('an environment value holding a NUL adds no option to the sandbox', async () => {
    // bwrap reads the environment NUL-separated: a secret's `a\0--cap-add\0ALL` gave the agent
    // every capability. bwrap refuses it (naming the variable, not the value); none may run with one.
    workspace ||= await t.runtime.pool.createWorkspace(sessionId('box'), 'rev_box')
    const env = { CAIRN_NUL: 'a\0--cap-add\0ALL' }
    const command = ['bash', '-c', 'grep CapEff /proc/self/status']
    const outcome = await startOn(t.runtime, isolation, '', command, {
      protocol: 'exec',
      workspaceDir: workspace,
      env,
    })
      .then(async ({ agent }) => {
        try {
          return completedText((await turn(agent, '', 1)).outcome)
        } finally {
          await t.runtime.stopAgent(agent)
        }
      })
      .catch((error: unknown) => error)
    if (isolation === 'bwrap') {
      expect(outcome).toBeInstanceOf(CairnProblem)
      expect((outcome as CairnProblem).code).toBe('sandbox_failed')
      expect((outcome as CairnProblem).message).toContain('CAIRN_NUL')
      expect((outcome as CairnProblem).message).not.toContain('cap-add')
    } else if (typeof outcome === 'string') expect(outcome).toMatch(/CapEff:\s+0+\n/)
  })

  test('runs in /workspace, the session subvolume, with the revision files', async () => {
    const out = await inside('pwd; echo "HOME=$HOME"; cat README.md; echo made > made.txt; ls -l made.txt')
    expect(out).toMatch(/^\/workspace\nHOME=\/workspace\nconformance\n-rw-r--r-- 1 agent agent 5 /)
    expect(statSync(path.join(workspace, 'made.txt')).size).toBe(5)
  })

  test('runs as uid 1000 (agent) with no capabilities; its files belong to host uid 61000', async () => {
    const out = await inside(
      'id -u; id -g; id -un; echo x > owned.txt; grep -E "^(CapEff|NoNewPrivs)" /proc/self/status; ' +
        'python3 -c "import os; os.setuid(0)" 2>/dev/null || echo "setuid refused"',
    )
    expect(out.split('\n').slice(0, 3)).toEqual(['1000', '1000', 'agent'])
    expect(out).toMatch(/CapEff:\s+0000000000000000/)
    expect(out).toMatch(/setuid refused\n$/)
    const owned = statSync(path.join(workspace, 'owned.txt'))
    expect([owned.uid, owned.gid]).toEqual([SANDBOX_UID, SANDBOX_UID])
  })

  test('gets exactly the same environment as every other driver', async () => {
    const out = await inside(
      'import os\nfor k in sorted(os.environ): print(k + "=" + os.environ[k])',
      'python3',
    )
    const names = out
      .split('\n')
      .filter(Boolean)
      .map((line) => line.split('=')[0])
    expect(names).toEqual([
      'CAIRN_PROTOCOL',
      'CAIRN_SESSION_ID',
      'CAIRN_TRANSCRIPT',
      'CAIRN_TURN',
      'HOME',
      'LANG',
      'NODE_PATH',
      'PATH',
      'PWD',
      'PYTHONPATH',
      'PYTHONUNBUFFERED',
      'TMPDIR',
      'USER',
    ])
    for (const line of [
      'PATH=/usr/local/bin:/usr/bin:/bin',
      'HOME=/workspace',
      'PWD=/workspace',
      'USER=agent',
      'LANG=C.UTF-8',
      'TMPDIR=/tmp',
      'CAIRN_TRANSCRIPT=/run/cairn/transcript.jsonl',
    ])
      expect(out).toContain(`${line}\n`)
  })

  test('has a read-only root; only /workspace, /tmp and /dev/shm are writable', async () => {
    const out = await inside(
      'touch /usr/cairn-x 2>/dev/null; echo "usr=$?"; touch /cairn-x 2>/dev/null; echo "root=$?"; ' +
        'touch /run/cairn/x 2>/dev/null; echo "run=$?"; touch /opt/cairn/x 2>/dev/null; echo "opt=$?"; ' +
        'touch /etc/passwd 2>/dev/null; echo "etc=$?"; touch /workspace/w /tmp/t /dev/shm/s && echo "scratch=$?"; ' +
        'grep -c "^agent:x:1000:1000" /etc/passwd; hostname; test -e /root/.cairn-test || echo "no host root"',
    )
    for (const place of ['usr', 'root', 'run', 'opt', 'etc']) expect(out).toContain(`${place}=1\n`)
    expect(out).toContain('scratch=0\n1\ncairn\nno host root\n')
    expect(existsSync('/usr/cairn-x')).toBe(false)
  })

  test('contains the escape attempts of the security suite', async () => {
    workspace ||= await t.runtime.pool.createWorkspace(sessionId('box'), 'rev_box')
    const outcome = await runOn(t.runtime, isolation, workspace, ESCAPE_PROBE, {
      shell: 'python3',
      input: 'all',
    })
    expect(parseProbeResults(completedText(outcome))).toEqual(CONTAINED[isolation])
  })

  test('has loopback only: no other interface, and the host is out of reach', async () => {
    const port = await serve('host secret', '0.0.0.0')
    const targets = ['127.0.0.1', ...(hostAddress ? [hostAddress] : [])]
    const out = await inside(
      `import socket
for host in ${JSON.stringify(targets)}:
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((host, ${port}))
        print(host, "CONNECTED")
    except OSError as e:
        print(host, type(e).__name__)
    finally:
        s.close()
print(sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]))
`,
      'python3',
    )
    expect(out).not.toContain('CONNECTED')
    expect(out).toContain('127.0.0.1 ConnectionRefusedError\n')
    expect(out).toContain("['lo']\n")
  })

  test.skipIf(!hostAddress)(
    'reaches an allowlisted host through the egress proxy, and nothing else',
    async () => {
      const address = hostAddress ?? ''
      const transparent = t.runtime.drivers[isolation].capabilities.transparentEgress
      const allowed = await serve('hello through the proxy', '0.0.0.0')
      const other = await serve('not for the agent', '0.0.0.0')
      const events: NetworkEvent[] = []
      const { agent } = await startOn(t.runtime, isolation, 'rev_box', ['python3', 'probe.py'], {
        egress: {
          policy: { allow: [`${address}:${allowed}`] },
          privateExceptions: new Set([address]),
          onEvent: (event) => events.push(event),
        },
      })
      try {
        expect(await reply(agent, `get http://${address}:${allowed}/`, 1)).toBe('hello through the proxy\n')
        expect(await reply(agent, `get http://${address}:${other}/`, 2)).toMatch(/403/)
        if (transparent) {
          // A plain socket, no proxy variable: redirected to the same proxy and the same checks.
          expect(await reply(agent, `raw ${address}:${allowed}`, 3)).toMatch(/^HTTP\/1\.1 200 OK\n$/)
          expect(await reply(agent, `raw ${address}:${other}`, 4)).toBe('HTTP/1.1 403 Forbidden\n')
        } else {
          expect(await reply(agent, `raw ${address}:${allowed}`, 3)).toMatch(/^ERR/) // no route but the proxy
        }
      } finally {
        await t.runtime.stopAgent(agent)
      }
      const expected = [`${allowed}:true`, `${other}:false`]
      expect(events.map((e) => `${e.port}:${e.allowed}`)).toEqual(
        transparent ? [...expected, ...expected] : expected,
      )
    },
  )

  test('leaves no process, cgroup, mount or driver state after stop, crash and kill', async () => {
    const before = instanceProcesses(t.runtime, { zombies: true })
    const warm = await startOn(t.runtime, isolation, 'rev_box', [
      'python3',
      '-c',
      'while True: print(input())',
    ])
    expect(await reply(warm.agent, 'up', 1)).toBe('up\n')
    expect(liveSandboxCgroups(t.runtime).length).toBeGreaterThan(0)
    expect(instanceProcesses(t.runtime).length).toBeGreaterThan(0)
    await t.runtime.stopAgent(warm.agent)
    // An agent that exits by itself, and one whose sandbox is killed mid-turn.
    expect(completedText(await runOn(t.runtime, isolation, warm.workspaceDir, 'echo bye; exit 0'))).toBe(
      'bye\n',
    )
    const hang = await startOn(t.runtime, isolation, 'rev_box', ['bash', '-c', 'read l; sleep 600'], {
      turnTimeoutMs: 500,
    })
    const { outcome } = await turn(hang.agent, 'hang', 1)
    expect(outcome).toMatchObject({ status: 'failed', code: 'timeout' })
    await t.runtime.stopAgent(hang.agent)

    expect(liveSandboxCgroups(t.runtime)).toEqual([])
    expect(await waitFor(() => instanceProcesses(t.runtime, { except: before }).length === 0)).toBe(true)
    expect(sandboxMounts(t.runtime)).toEqual([])
    expect(gvisorLeftovers(t.runtime)).toEqual([])
  })
})

describe('driver selection', () => {
  it('lists both drivers with their capabilities, and picks the one an agent asks for', async () => {
    const list = await t.runtime.isolations()
    expect(list.map((d) => [d.name, d.default])).toEqual([
      ['bwrap', true],
      ['gvisor', false],
    ])
    for (const info of list) {
      expect(info.capabilities).toEqual(t.runtime.drivers[info.name].capabilities)
      expect(info.available).toBe(drivers[info.name].ok)
    }
    expect(t.runtime.driverFor(undefined).name).toBe('bwrap')
    expect(t.runtime.driverFor('gvisor').name).toBe('gvisor')
  })

  it('refuses gVisor with a typed error where runsc is missing', async () => {
    const driver = new GvisorDriver({
      cgroups: undefined as never,
      hostUid: SANDBOX_UID,
      hostGid: SANDBOX_UID,
      etcDir: '/nonexistent',
      kitDir: '/nonexistent',
      stateDir: path.join(t.runtime.runDir, 'gvisor-missing'),
      runscPath: '/nonexistent/runsc',
    })
    expect(await driver.availability()).toMatchObject({ ok: false })
    const refusal = await driver
      .start({
        id: 'sbx_missing',
        workspaceDir: '/nonexistent',
        runDir: '/nonexistent',
        command: ['true'],
        env: {},
        limits: { memoryMiB: 64, pids: 16, cpus: 1 },
      })
      .catch((e: unknown) => e)
    expect(refusal).toBeInstanceOf(CairnProblem)
    expect(refusal).toMatchObject({ code: 'unavailable', details: { driver: 'gvisor' } })
  })
})
