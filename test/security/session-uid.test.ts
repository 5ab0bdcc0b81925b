import { execFileSync } from 'node:child_process'
import { existsSync, readdirSync, readFileSync, readlinkSync, statSync } from 'node:fs'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { SANDBOX_UID } from '../conformance/harness.js'
import { askProbe, probeProjectFiles } from '../helpers/probe.js'
import { makeProject } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'

/**
 * The second wall behind the seccomp filter (bwrap): every sandbox runs as a host uid of its own,
 * and sees its workspace through an idmapped mount; on disk, every workspace belongs to the shared
 * sandbox uid. An agent that got past the filter and out of its mount namespace with its uid
 * (simulated here: a host process with that sandbox's uid and no filter at all) does not own
 * another session's files, so it can neither write, delete nor destroy them.
 *
 * bwrap only: under gVisor the agent's system calls never reach the host kernel (gVisor's own
 * kernel answers them; its gofer, the host process that opens files, runs as root), and the
 * sandboxes keep the shared uid (docs/isolation.md).
 */
let t: TestServer

beforeAll(async () => {
  t = await startTestServer()
  const project = await makeProject(probeProjectFiles('uid-probe', 'bwrap'))
  expect((await t.api.deploy(project)).status).toBe(201)
  const small = await makeProject(probeProjectFiles('uid-probe-small', 'bwrap', true))
  expect((await t.api.deploy(small)).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
})

const ask = (sessionId: string, message: string) => askProbe(t.api, sessionId, message)

/** The host uid of a session's warm sandbox (its agent process). */
function hostUidOf(sessionId: string): number {
  const pid = t.server.runtime.agentOf(sessionId)?.pid
  const uids = /^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
  return Number(uids?.[1])
}

/** Runs python code on the host as `uid` (no seccomp filter, no namespaces): one line of answer. */
function asUid(uid: number, code: string, ...args: string[]): string {
  return execFileSync(
    'setpriv',
    [
      '--reuid',
      String(uid),
      '--regid',
      String(uid),
      '--clear-groups',
      '/usr/bin/python3',
      '-c',
      code,
      ...args,
    ],
    { encoding: 'utf8' },
  ).trim()
}

const ATTEMPTS = `import ctypes, fcntl, os, sys
ws, subvolid = sys.argv[1], int(sys.argv[2])
def attempt(fn):
    try:
        fn()
        return "done"
    except OSError as e:
        return e.strerror
def destroy():
    args = ctypes.create_string_buffer(4096)
    ctypes.c_uint64.from_buffer(args, 16).value = 1 << 4
    ctypes.c_uint64.from_buffer(args, 56).value = subvolid
    fd = os.open(ws, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, 0x5000943F, args)
    finally:
        os.close(fd)
print(" ".join([
    "write=" + attempt(lambda: open(os.path.join(ws, "planted.txt"), "w").write("x")),
    "append=" + attempt(lambda: open(os.path.join(ws, "secret.txt"), "a").write("x")),
    "remove=" + attempt(lambda: os.remove(os.path.join(ws, "secret.txt"))),
    "rmdir=" + attempt(lambda: os.rmdir(os.path.join(ws, "nested"))),
    "destroy=" + attempt(destroy),
]))
`

describe('bwrap driver: a host uid per sandbox', () => {
  it("an agent past the seccomp filter, with its sandbox's host uid, cannot touch another session's files", async () => {
    const attacker = (await t.api.createSession('uid-probe')).id
    const victim = (await t.api.createSession('uid-probe')).id
    expect(await ask(victim, 'write secret.txt the victim keeps this')).toBe('wrote secret.txt')
    expect(await ask(attacker, 'write mine.txt the attacker')).toBe('wrote mine.txt')
    const attackerUid = hostUidOf(attacker)
    const victimUid = hostUidOf(victim)
    expect(attackerUid).not.toBe(SANDBOX_UID)
    expect(victimUid).not.toBe(SANDBOX_UID)
    expect(attackerUid).not.toBe(victimUid)
    // On disk, both workspaces belong to the shared uid; each agent saw its files as its own.
    const victimWorkspace = t.server.runtime.pool.workspacePath(victim)
    const nested = path.join(victimWorkspace, 'nested')
    execFileSync('btrfs', ['subvolume', 'create', nested], { stdio: 'ignore' })
    execFileSync('chown', [`${SANDBOX_UID}:${SANDBOX_UID}`, nested])
    const nestedId = /Subvolume ID:\s+(\d+)/.exec(
      execFileSync('btrfs', ['subvolume', 'show', nested], { encoding: 'utf8' }),
    )?.[1]
    expect(asUid(attackerUid, ATTEMPTS, victimWorkspace, String(nestedId))).toBe(
      'write=Permission denied append=Permission denied remove=Permission denied rmdir=Permission denied destroy=Permission denied',
    )
    expect(readFileSync(path.join(victimWorkspace, 'secret.txt'), 'utf8')).toBe('the victim keeps this')
    expect(await ask(victim, 'cat secret.txt')).toBe('the victim keeps this')
    expect(await ask(victim, 'write after.txt still mine')).toBe('wrote after.txt')
    // Its own workspace too is not the attacker's outside its idmapped mount.
    const own = t.server.runtime.pool.workspacePath(attacker)
    expect(asUid(attackerUid, ATTEMPTS, own, String(nestedId))).toMatch(/^write=Permission denied /)
    expect(await ask(attacker, 'cat mine.txt')).toBe('the attacker')
  })

  it("a warm sandbox's idmapped mounts are in its own namespace, none in the host's mount table", async () => {
    // Every mount left in the host's table is copied by each later sandbox's start (issue 33:
    // 3,281 of them beside 1,640 warm sandboxes, a cold start 20 times slower).
    const runDir = t.server.runtime.runDir
    const hostMounts = () =>
      readFileSync('/proc/self/mountinfo', 'utf8')
        .split('\n')
        .filter((line) => (line.split(' ')[4] ?? '').startsWith(`${runDir}/`))
    const before = hostMounts()
    const ids = [(await t.api.createSession('uid-probe')).id, (await t.api.createSession('uid-probe')).id]
    for (const [k, id] of ids.entries())
      expect(await ask(id, `write own.txt session ${k}`)).toBe('wrote own.txt')
    expect(hostMounts()).toEqual(before)
    for (const [k, id] of ids.entries()) {
      // Inside (bwrap's child, the init of the sandbox's namespaces), the workspace is still its own
      // idmapped view.
      const pid = t.server.runtime.agentOf(id)?.pid
      const init = readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(' ')[0]
      const workspace = readFileSync(`/proc/${init}/mountinfo`, 'utf8')
        .split('\n')
        .find((line) => line.split(' ')[4] === '/workspace')
      expect(workspace).toMatch(/\bidmapped\b/)
      expect(await ask(id, 'cat own.txt')).toBe(`session ${k}`)
    }
  })

  it("a warm sandbox holds one of the server's descriptors, none of them a file of its run dir", async () => {
    // The server's open-files limit (20,000 hard here) bounded the warm sessions a server holds
    // (issue 33): five a session (the agent's stdin, stdout and stderr, its transcript and turn
    // files) held about 3,960. Now one socket is the agent's stdin and stdout, its stderr goes to a
    // file the server reads, and the run dir's files are open only while a turn writes them.
    const runDir = t.server.runtime.runDir
    const ids = [(await t.api.createSession('uid-probe')).id, (await t.api.createSession('uid-probe')).id]
    for (const id of ids) expect(await ask(id, 'whoami')).toMatch(/\w/)
    // A turn still gets the agent's stderr (now from its file).
    const id = ids[0] as string
    expect(await ask(id, 'stderr hello-from-stderr')).toBe('wrote stderr')
    const turns = (await t.api.call('GET', `/v1/sessions/${id}/turns`)).body.data as { stderrTail: string }[]
    expect(turns.map((turn) => turn.stderrTail)).toEqual(['', 'hello-from-stderr\n'])
    // Its file, outside the run dir the sandbox sees, is the server's alone.
    const stderrFile = path.join(
      t.server.runtime.stderrDir,
      `${t.server.runtime.agentOf(id)?.sandboxId}.stderr`,
    )
    expect(statSync(stderrFile).mode & 0o777).toBe(0o600)
    // What the server holds for them is what it closes when they stop (counting before they
    // warmed would count the spare launchers started since and the helpers started on first use).
    const held = sandboxDescriptors(runDir)
    for (const each of ids) expect((await t.api.call('DELETE', `/v1/sessions/${each}`)).status).toBe(200)
    expect(ids.map((each) => t.server.runtime.agentOf(each))).toEqual([undefined, undefined])
    const left = sandboxDescriptors(runDir)
    expect(held.filter((fd) => !left.includes(fd))).toHaveLength(ids.length)
    expect(held.filter((fd) => fd.includes(`${runDir}/`))).toEqual([])
  })
})

describe("an agent's stderr between turns", () => {
  it('counts in its memory: a process left writing stderr after its turn cannot fill the host disk', async () => {
    // A warm bwrap agent's stderr is a file the server reads at each turn's end and empties at
    // the next one's start (issue 33's descriptor cut): between turns nothing bounded it, and on a
    // host whose /run is a disk (ext4 here) a process the agent left running wrote it without
    // end. The file is on a tmpfs now, whose pages count in the writer's memory cgroup (64 MiB).
    const id = (await t.api.createSession('uid-probe-small')).id
    expect(await ask(id, 'whoami')).toMatch(/\w/)
    const file = path.join(t.server.runtime.stderrDir, `${t.server.runtime.agentOf(id)?.sandboxId}.stderr`)
    expect(await ask(id, 'stderr-flood 200')).toBe('flooding')
    let largest = 0
    let last = -1
    for (let stable = 0, waited = 0; stable < 5 && waited < 30_000; waited += 200) {
      await new Promise((resolve) => setTimeout(resolve, 200))
      const size = existsSync(file) ? statSync(file).size : 0
      largest = Math.max(largest, size)
      stable = size === last ? stable + 1 : 0
      last = size
    }
    expect(largest).toBeLessThan(64 << 20)
    expect((await t.api.call('DELETE', `/v1/sessions/${id}`)).status).toBe(200)
  })
})

/**
 * The descriptors of this process (the server's) that a sandbox can hold: Unix sockets, pipes and
 * files under the run dir (not the test client's TCP connections to the server).
 */
function sandboxDescriptors(runDir: string): string[] {
  const tcp = new Set<string>()
  for (const table of ['/proc/self/net/tcp', '/proc/self/net/tcp6'])
    for (const line of readFileSync(table, 'utf8').split('\n').slice(1))
      if (line.trim()) tcp.add(line.trim().split(/\s+/)[9] as string)
  const held: string[] = []
  for (const fd of readdirSync('/proc/self/fd')) {
    let target: string
    try {
      target = readlinkSync(`/proc/self/fd/${fd}`)
    } catch {
      continue
    }
    const socket = /^socket:\[(\d+)\]$/.exec(target)
    if (
      (socket && !tcp.has(socket[1] as string)) ||
      target.startsWith('pipe:') ||
      target.startsWith(`${runDir}/`)
    )
      held.push(`${fd} ${target}`)
  }
  return held
}
