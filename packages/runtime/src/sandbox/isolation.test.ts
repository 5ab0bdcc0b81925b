import { randomBytes } from 'node:crypto'
import { existsSync, readFileSync, statSync } from 'node:fs'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import net from 'node:net'
import { networkInterfaces, tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import {
  makeRevision,
  openTestRuntime,
  poolMounts,
  reply,
  SANDBOX_UID,
  sandboxRun,
  sessionId,
  startAgent,
  type TestRuntime,
} from '../../test/harness.js'
import type { TurnOutcome } from '../agent/types.js'
import { DEFAULT_SANDBOX_UID_RANGE } from './sandbox-uids.js'

// Per test process: two runs of this file side by side must not remove each other's file.
const ROOT_SECRET = `/root/.cairn-test-secret-${process.pid}`
const secret = randomBytes(12).toString('hex')

let t: TestRuntime
let hostTmp: string
let workspace: string

beforeAll(async () => {
  await writeFile(ROOT_SECRET, `root secret ${secret}\n`, { mode: 0o600 })
  hostTmp = await mkdtemp(path.join(tmpdir(), 'cairn-host-'))
  await writeFile(path.join(hostTmp, 'host-file.txt'), `tmp secret ${secret}\n`, { mode: 0o644 })
  t = await openTestRuntime()
  await makeRevision(t.runtime, 'rev_iso', { 'README.md': 'isolation\n' })
  workspace = await t.runtime.pool.createWorkspace(sessionId('iso'), 'rev_iso')
})

afterAll(async () => {
  await rm(ROOT_SECRET, { force: true })
  await rm(hostTmp, { recursive: true, force: true })
  const runtime = t.runtime
  await t.close()
  expect(poolMounts(runtime)).toBe(0)
})

/** Runs a bash script in a fresh sandbox on the shared workspace and returns its stdout. */
async function inside(script: string, shell: 'bash' | 'python3' = 'bash'): Promise<string> {
  const outcome = await sandboxRun(t.runtime, workspace, script, { shell })
  return completedText(outcome)
}

function completedText(outcome: TurnOutcome): string {
  if (outcome.status !== 'completed') throw new Error(`sandbox script failed: ${JSON.stringify(outcome)}`)
  return outcome.text
}

describe('sandbox isolation', () => {
  it("cannot read the host's /root", async () => {
    expect(readFileSync(ROOT_SECRET, 'utf8')).toContain(secret)
    const out = await inside(
      `cat ${ROOT_SECRET} 2>&1; echo "cat=$?"; ls -A /root 2>&1; echo "ls=$?"; echo "found=$(grep -rls ${secret} / --exclude-dir=proc --exclude-dir=usr | wc -l)"`,
    )
    expect(out).not.toContain(secret)
    expect(out).toMatch(/cat=1\n/)
    expect(out).toMatch(/ls=2\n/)
    expect(out).toMatch(/found=0\n/) // not anywhere in the sandbox's file system
  })

  it('gets a fresh, private tmpfs at /tmp', async () => {
    const out = await inside(
      `ls -A /tmp; echo "entries=$(ls -A /tmp | wc -l)"; stat -f -c %T /tmp; cat ${hostTmp}/host-file.txt 2>&1; echo written > /tmp/inside.txt && echo ok`,
    )
    expect(out).not.toContain(secret)
    expect(out).toContain('entries=0\n')
    expect(out).toContain('tmpfs\n')
    expect(out).toContain('No such file or directory')
    expect(out).toMatch(/ok\n$/)
    expect(existsSync('/tmp/inside.txt')).toBe(false)
    // Another sandbox does not see the first one's /tmp either.
    expect(await inside('ls -A /tmp | wc -l')).toBe('0\n')
  })

  it("cannot see another session's workspace", async () => {
    const otherId = sessionId('other')
    const other = await t.runtime.pool.createWorkspace(otherId, 'rev_iso')
    await writeFile(path.join(other, 'other-secret.txt'), `other ${secret}\n`)
    const out = await inside(
      `ls ${other} >/dev/null 2>&1; echo "ls=$?"; echo "run=$(ls -A /run /run/cairn | tr '\\n' ' ')"; ` +
        `echo "mounted=$(grep -c ${otherId} /proc/self/mountinfo)"; ` +
        `echo "find=$(find / \\( -path /proc -o -path /usr \\) -prune -o -name other-secret.txt -print 2>/dev/null | wc -l)"; ` +
        `echo "found=$(grep -rls ${secret} / --exclude-dir=proc --exclude-dir=usr | wc -l)"`,
    )
    expect(out).toBe(
      [
        'ls=2',
        'run=/run: cairn  /run/cairn: transcript.jsonl turn ',
        'mounted=0',
        'find=0',
        'found=0',
        '',
      ].join('\n'),
    )
    await t.runtime.pool.deleteWorkspace(otherId)
  })

  it('cannot see host processes', async () => {
    const out = await inside('ps -e -o pid=,comm=; echo ---; ls /proc | grep -cE "^[0-9]+$"')
    const [ps, count] = out.split('---\n')
    const procs = (ps ?? '').trim().split('\n')
    // bwrap as the namespace's init, the shell, and ps itself.
    expect(procs.length).toBeLessThanOrEqual(4)
    expect(procs.map((line) => line.trim().split(/\s+/)[1])).toEqual(expect.arrayContaining(['bwrap', 'ps']))
    expect(ps).not.toMatch(/node|vitest|init|systemd/)
    expect(Number(count)).toBeLessThanOrEqual(4)
    expect(await inside('echo $$')).toMatch(/^[2-9]\n$/)
  })

  it('cannot reach a TCP server on the host, not on 127.0.0.1 nor on its other addresses', async () => {
    const server = net.createServer((socket) => socket.end('hello from the host\n'))
    await new Promise<void>((resolve) => server.listen(0, '0.0.0.0', resolve))
    const address = server.address()
    const port = typeof address === 'object' && address ? address.port : 0
    const hostAddresses = Object.values(networkInterfaces())
      .flat()
      .filter((a) => a && a.family === 'IPv4' && !a.internal)
      .map((a) => a?.address)
    try {
      // The server works from the host.
      const fromHost = await new Promise<string>((resolve, reject) => {
        const socket = net.connect(port, '127.0.0.1')
        let data = ''
        socket.on('data', (chunk) => {
          data += chunk
        })
        socket.on('end', () => resolve(data))
        socket.on('error', reject)
      })
      expect(fromHost).toBe('hello from the host\n')

      const script = `import socket
for host in ${JSON.stringify(['127.0.0.1', ...hostAddresses])}:
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((host, ${port}))
        print(host, "connected", s.recv(100))
    except OSError as e:
        print(host, type(e).__name__)
    finally:
        s.close()
print(sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]))
`
      const out = await inside(script, 'python3')
      expect(out).not.toContain('connected')
      expect(out).toContain('127.0.0.1 ConnectionRefusedError\n')
      for (const host of hostAddresses)
        expect(out).toMatch(new RegExp(`${host} (OSError|ConnectionRefusedError)`))
      expect(out).toContain("['lo']")
    } finally {
      await new Promise((r) => server.close(r))
    }
  })

  it('runs as uid 1000 inside; its files belong to host uid 61000, its processes to a host uid of its own', async () => {
    const out = await inside(
      'id -u; id -g; id -un; echo made > made-inside.txt; grep -E "^(Uid|CapEff|NoNewPrivs)" /proc/self/status',
    )
    const lines = out.split('\n')
    expect(lines.slice(0, 3)).toEqual(['1000', '1000', 'agent'])
    expect(out).toMatch(/CapEff:\s+0000000000000000/)
    expect(out).toMatch(/NoNewPrivs:\s+1/)
    const made = statSync(path.join(workspace, 'made-inside.txt'))
    expect(made.uid).toBe(SANDBOX_UID)
    expect(made.gid).toBe(SANDBOX_UID)

    // The processes of a running sandbox, seen from the host.
    const { agent } = await startAgent(t.runtime, 'rev_iso', ['python3', '-c', 'while True: print(input())'])
    try {
      expect(await reply(agent, 'up', 1)).toBe('up\n')
      const procs = readFileSync(
        `/sys/fs/cgroup/pids/cairn/${path.basename(t.runtime.runDir)}/${agent.sandboxId}/cgroup.procs`,
        'utf8',
      )
        .split('\n')
        .filter(Boolean)
      expect(procs.length).toBeGreaterThanOrEqual(2)
      const uids = new Set<string>()
      for (const pid of procs) {
        const status = readFileSync(`/proc/${pid}/status`, 'utf8')
        const ids = /^Uid:\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$/m.exec(status)?.slice(1)
        expect(new Set(ids).size, `pid ${pid}: ${ids}`).toBe(1)
        uids.add(ids?.[0] ?? '')
      }
      // One uid for the whole sandbox, from the per-sandbox range, not the owner of the files.
      expect(uids.size).toBe(1)
      const uid = Number([...uids][0])
      expect(uid).toBeGreaterThanOrEqual(DEFAULT_SANDBOX_UID_RANGE.first)
      expect(uid).toBeLessThan(DEFAULT_SANDBOX_UID_RANGE.first + DEFAULT_SANDBOX_UID_RANGE.count)
      // Another sandbox running at the same time has another uid.
      const second = await startAgent(t.runtime, 'rev_iso', ['python3', '-c', 'while True: print(input())'])
      try {
        expect(await reply(second.agent, 'up', 1)).toBe('up\n')
        expect(readFileSync(`/proc/${second.agent.pid}/status`, 'utf8')).not.toMatch(
          new RegExp(`^Uid:\\s+${uid}\\s`, 'm'),
        )
      } finally {
        await t.runtime.stopAgent(second.agent)
      }
    } finally {
      await t.runtime.stopAgent(agent)
    }
  })

  it('has a read-only root, /usr, /run/cairn and /opt/cairn; only /workspace and scratch space are writable', async () => {
    const out = await inside(
      'touch /usr/cairn-x 2>&1; echo "usr=$?"; touch /cairn-x 2>&1; echo "root=$?"; touch /run/cairn/x 2>&1; echo "run=$?"; ' +
        'awk \'$5 == "/usr" || $5 == "/run/cairn" || $5 == "/opt/cairn" { print $5, $6 }\' /proc/self/mountinfo; ' +
        'touch /workspace/rw-ok && echo "workspace=$?"; touch /tmp/ok /dev/shm/ok && echo "scratch=$?"',
    )
    expect(out).toMatch(/usr=1\n/)
    expect(out).toMatch(/root=1\n/)
    expect(out).toMatch(/run=1\n/)
    expect(out).toMatch(/^\/usr ro,/m)
    expect(out).toMatch(/^\/run\/cairn ro,/m)
    expect(out).toMatch(/^\/opt\/cairn ro,/m)
    expect(out).toContain('workspace=0\n')
    expect(out).toContain('scratch=0\n') // /tmp and /dev/shm stay writable
    expect(existsSync('/usr/cairn-x')).toBe(false)
  })

  it('cannot create user namespaces', async () => {
    const out = await inside('unshare -U true 2>&1; echo "U=$?"; unshare -r true 2>&1; echo "r=$?"')
    expect(out).toMatch(/U=1\n/)
    expect(out).toMatch(/r=1\n/)
    expect(out).not.toMatch(/U=0|r=0/)
  })

  it('sees generated /etc files, not the host ones', async () => {
    const out = await inside('cat /etc/passwd; hostname; ls /dev')
    expect(out).toContain('agent:x:1000:1000')
    expect(out).not.toMatch(/^(daemon|bin|sys):/m)
    expect(out).toContain('cairn\n')
    expect(out).not.toMatch(/loop|sd[a-z]|nvme|vd[a-z]/)
  })

  it('the agent cannot create a subvolume in its workspace (no btrfs ioctl passes the seccomp filter)', async () => {
    const id = sessionId('sub')
    const ws = await t.runtime.pool.createWorkspace(id, 'rev_iso')
    const outcome = await sandboxRun(
      t.runtime,
      ws,
      'btrfs subvolume create /workspace/mine 2>&1 >/dev/null; echo "exit $?"',
    )
    expect(completedText(outcome)).toBe('ERROR: cannot create subvolume: Operation not permitted\nexit 1\n')
    expect(existsSync(path.join(ws, 'mine'))).toBe(false)
    // The rule also refuses FICLONE (type 0x94): cp falls back to copying (copy_file_range).
    const copied = await sandboxRun(
      t.runtime,
      ws,
      'head -c 3000000 /dev/urandom > a && cp a b && cp --reflink=auto a c && cmp a b && cmp a c && echo same',
    )
    expect(completedText(copied)).toBe('same\n')
    await t.runtime.pool.deleteWorkspace(id)
    expect(existsSync(ws)).toBe(false)
  })
})
