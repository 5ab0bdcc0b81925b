import { spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { IsolationName } from '../../packages/protocol/src/index.js'
import { DRIVERS, probeDrivers } from '../conformance/harness.js'
import { makeProject, SHELL_AGENT } from '../helpers/projects.js'
import { packDir, startTestServer, type TestServer } from '../helpers/server.js'

/**
 * Secrets are in no process's arguments: `/proc/PID/cmdline` is readable by every local user, for
 * the whole life of the process. A reader running as `nobody` scans every `/proc/*\/cmdline` (and
 * every `environ` it may read) while a revision builds with a setup secret, while a session's
 * setup phase runs, and while its agent is warm with a runtime secret, on each driver; with the
 * bwrap driver both with spare launchers (the command handed over on a pipe) and without.
 */
const drivers = await probeDrivers()

/** Scans /proc until its stdin closes; the values come on stdin, never in its own arguments. */
const SCANNER = `
import json, os, select, sys
values = [v.encode() for v in json.loads(sys.stdin.readline())]
me, hits, seen, passes = os.getpid(), {}, {}, 0
def read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None
while not select.select([sys.stdin], [], [], 0)[0] or sys.stdin.readline():
    passes += 1
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        for name in ("cmdline", "environ"):
            data = read("/proc/%s/%s" % (pid, name))
            if not data:
                continue
            text = data.replace(b"\\0", b" ").decode("utf8", "replace")
            if name == "cmdline" and ("bwrap" in text or "runsc" in text):
                seen[text[:2000]] = seen.get(text[:2000], 0) + 1
            for v in values:
                if v in data:
                    hits["%s/%s" % (pid, name)] = text[:300]
print(json.dumps({"passes": passes, "hits": hits, "seen": list(seen)}))
`

interface ScanResult {
  passes: number
  hits: Record<string, string>
  seen: string[]
}

/** Starts the scanner as uid/gid 65534 with no groups; `stop` ends it and gives what it saw. */
function startScanner(values: string[]): { stop: () => Promise<ScanResult> } {
  const child = spawn(
    'setpriv',
    ['--reuid', '65534', '--regid', '65534', '--clear-groups', '/usr/bin/python3', '-I', '-c', SCANNER],
    { stdio: ['pipe', 'pipe', 'inherit'] },
  )
  let out = ''
  child.stdout.on('data', (chunk: Buffer) => {
    out += chunk.toString('utf8')
  })
  const done = new Promise<ScanResult>((resolve, reject) => {
    child.once('error', reject)
    child.once('close', (code) =>
      code === 0 ? resolve(JSON.parse(out) as ScanResult) : reject(new Error(`scanner exit ${code}`)),
    )
  })
  child.stdin.write(`${JSON.stringify(values)}\n`)
  return {
    stop: () => {
      child.stdin.end()
      return done
    },
  }
}

const servers: TestServer[] = []

afterAll(async () => {
  for (const t of servers) await t.close()
})

/** One setting: a server (spare launchers or none) and the drivers it is checked on. */
const settings: { name: string; spareLaunchers: number; isolations: IsolationName[] }[] = [
  { name: 'spare launchers', spareLaunchers: 2, isolations: DRIVERS.filter((d) => drivers[d].ok) },
  { name: 'no spare launchers', spareLaunchers: 0, isolations: ['bwrap'] },
]

describe.each(settings)('secrets in /proc/*/cmdline ($name)', ({ spareLaunchers, isolations }) => {
  let t: TestServer

  beforeAll(async () => {
    t = await startTestServer({ server: { spareLaunchers } })
    servers.push(t)
  })

  it.each(isolations)(
    '%s: no secret in any argument during a build, a setup phase and a warm agent',
    async (isolation) => {
      const agent = `argv-${isolation}`
      const setupValue = `setup-${randomBytes(12).toString('hex')}`
      const runtimeValue = `runtime-${randomBytes(12).toString('hex')}`
      const envValue = `plain-${randomBytes(12).toString('hex')}`
      const project = await makeProject({
        // The build's setup waits only once it has the secret, so the scan sees that sandbox.
        'cairn.yaml': `name: ${agent}\ncommand: bash agent.sh\nisolation: ${isolation}\nsetup: bash build.sh\n`,
        'build.sh': 'test -z "$SETUP_TOKEN" || sleep 1\n',
        'agent.sh': SHELL_AGENT,
      })
      expect((await t.api.deploy(project)).status).toBe(201)
      const put = (secrets: Record<string, string>, scope: string) =>
        t.api.call('PUT', `/v1/agents/${agent}/secrets`, { secrets, scope })
      expect((await put({ SETUP_TOKEN: setupValue }, 'setup')).status).toBe(200)
      expect((await put({ RUN_TOKEN: runtimeValue }, 'runtime')).status).toBe(200)

      const scanner = startScanner([setupValue, runtimeValue, envValue])
      let scan: ScanResult | undefined
      try {
        const built = await t.api.call('POST', '/v1/agents?wait=true', await packDir(project))
        expect(built.body.revision?.status, JSON.stringify(built.body)).toBe('READY')
        const { id } = await t.api.createSession(agent, {
          setup: { command: 'sleep 1 && echo setup-phase-ran', env: { PLAIN_SETTING: envValue } },
        })
        const turn = await t.api.send(id, 'echo ${#RUN_TOKEN}')
        expect(turn.text).toBe(`${runtimeValue.length}\n[exit 0]\n`)
        // The agent stays warm after its turn, with the runtime secret in its environment.
        const warm = await t.api.call('GET', `/v1/sessions/${id}`)
        expect(warm.status).toBe(200)
        await new Promise((resolve) => setTimeout(resolve, 300))
      } finally {
        scan = await scanner.stop()
      }
      expect(scan.hits).toEqual({})
      // The scan did look while the sandboxes lived: the build's, the setup's and the agent's.
      expect(scan.passes).toBeGreaterThan(0)
      const sandboxes = scan.seen.filter((cmd) => cmd.includes(isolation === 'bwrap' ? 'bwrap' : 'runsc'))
      if (isolation === 'bwrap') {
        expect(sandboxes.some((cmd) => cmd.includes('build.sh'))).toBe(true)
        expect(sandboxes.some((cmd) => cmd.includes('setup-phase-ran'))).toBe(true)
        expect(sandboxes.some((cmd) => cmd.includes('agent.sh'))).toBe(true)
      }
      expect(sandboxes.length).toBeGreaterThanOrEqual(3)
    },
  )
})
