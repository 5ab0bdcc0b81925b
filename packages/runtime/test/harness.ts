import { execFileSync } from 'node:child_process'
import { existsSync, readdirSync, readFileSync } from 'node:fs'
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import type { AgentProtocolName } from '@cairn/protocol'
import type { AgentProcess } from '../src/agent/agent-process.js'
import type { AgentEvent, AgentLaunch, TurnOutcome } from '../src/agent/types.js'
import type { AgentSpec } from '../src/port/runtime-port.js'
import { Runtime } from '../src/runtime.js'
import { readMounts } from '../src/util/mounts.js'

export const POOL_BYTES = 512 * 1024 * 1024
export const SANDBOX_UID = 61000

/** A real runtime on a fresh loop-backed btrfs pool under a temporary data dir. */
export interface TestRuntime {
  runtime: Runtime
  dataDir: string
  /** Closes the runtime, checks the pool is unmounted and its loop device freed, removes the data dir. */
  close(): Promise<void>
}

export async function openTestRuntime(): Promise<TestRuntime> {
  const dataDir = await mkdtemp(path.join(tmpdir(), 'cairn-rt-'))
  const runtime = new Runtime({ dataDir, poolImageSizeBytes: POOL_BYTES })
  await runtime.open()
  return {
    runtime,
    dataDir,
    async close() {
      try {
        await runtime.close()
      } finally {
        await rm(dataDir, { recursive: true, force: true })
      }
    },
  }
}

export function poolMounts(runtime: Runtime): number {
  return readMounts().filter((m) => m.mountPoint === runtime.pool.root).length
}

/** Loop devices backed by the pool image of this data dir. */
export function loopDevicesFor(dataDir: string): string[] {
  const out = execFileSync('losetup', ['-j', path.join(dataDir, 'pool.img')], { encoding: 'utf8' })
  return out.split('\n').filter(Boolean)
}

/** Writes files into a staging subvolume and seals it as a read-only revision. */
export async function makeRevision(
  runtime: Runtime,
  revisionId: string,
  files: Record<string, string>,
): Promise<string> {
  const staging = await runtime.pool.createStaging(revisionId)
  for (const [name, body] of Object.entries(files)) {
    const file = path.join(staging, name)
    await mkdir(path.dirname(file), { recursive: true })
    await writeFile(file, body)
  }
  return runtime.pool.sealRevision(staging, revisionId)
}

let sessionCounter = 0

/** A short session id the pool accepts (`ses_<base36>`), unique within this test process. */
/** A port test's agent: its revision's `agent.py` on python3, over stdio, with small limits. */
export function agentSpec(sessionId: string, tenantId: string, turnTimeoutMs = 20_000): AgentSpec {
  return {
    sessionId,
    tenantId,
    command: ['python3', 'agent.py'],
    protocol: 'stdio',
    env: {},
    limits: { memoryMiB: 256, pids: 64, cpus: 1 },
    turnTimeoutMs,
  }
}

export function sessionId(tag: string): string {
  sessionCounter++
  return `ses_${tag}${process.pid.toString(36)}x${sessionCounter.toString(36)}`
}

export interface StartOptions {
  protocol?: AgentProtocolName
  memoryMiB?: number
  pids?: number
  cpus?: number
  turnTimeoutMs?: number
  env?: Record<string, string>
  workspaceDir?: string
}

/** Starts an agent on a fresh workspace of `revisionId` (or on `workspaceDir` when given). */
export async function startAgent(
  runtime: Runtime,
  revisionId: string,
  command: string[],
  options: StartOptions = {},
): Promise<{ agent: AgentProcess; workspaceDir: string; sessionId: string }> {
  const id = sessionId('s')
  const workspaceDir = options.workspaceDir ?? (await runtime.pool.createWorkspace(id, revisionId))
  const launch: AgentLaunch = {
    sessionId: id,
    workspaceDir,
    command,
    protocol: options.protocol ?? 'stdio',
    env: options.env ?? {},
    limits: { memoryMiB: options.memoryMiB ?? 256, pids: options.pids ?? 64, cpus: options.cpus ?? 1 },
    turnTimeoutMs: options.turnTimeoutMs ?? 10_000,
  }
  const agent = await runtime.startAgent(launch)
  return { agent, workspaceDir, sessionId: id }
}

export interface TurnResult {
  outcome: TurnOutcome
  events: AgentEvent[]
}

/** Runs one turn and collects its events. */
export async function turn(agent: AgentProcess, prompt: string, n: number): Promise<TurnResult> {
  const events: AgentEvent[] = []
  const outcome = await agent.runTurn({ prompt, turn: n, turnId: `trn_t${n}`, transcript: [] }, (event) =>
    events.push(event),
  )
  return { outcome, events }
}

/** Runs one turn that must complete and returns its reply text. */
export async function reply(agent: AgentProcess, prompt: string, n: number): Promise<string> {
  const { outcome } = await turn(agent, prompt, n)
  if (outcome.status !== 'completed') {
    throw new Error(`turn ${n} did not complete: ${JSON.stringify(outcome)}`)
  }
  return outcome.text
}

/** Runs a one-shot command in a sandbox (exec protocol) and returns its outcome. */
export async function sandboxRun(
  runtime: Runtime,
  workspaceDir: string,
  script: string,
  options: { shell?: 'bash' | 'python3'; input?: string } = {},
): Promise<TurnOutcome> {
  const command = options.shell === 'python3' ? ['python3', '-c', script] : ['bash', '-c', script]
  const agent = await runtime.startAgent({
    sessionId: sessionId('x'),
    workspaceDir,
    command,
    protocol: 'exec',
    env: {},
    limits: { memoryMiB: 256, pids: 64, cpus: 1 },
    turnTimeoutMs: 10_000,
  })
  try {
    const { outcome } = await turn(agent, options.input ?? '', 1)
    return outcome
  } finally {
    await runtime.stopAgent(agent)
  }
}

/** Host cgroup directories of one sandbox, in every hierarchy Cairn uses. */
export function sandboxCgroupDirs(runtime: Runtime, sandboxId: string): string[] {
  const instance = path.basename(runtime.runDir)
  return cgroupHierarchies().map((h) => path.join('/sys/fs/cgroup', h, 'cairn', instance, sandboxId))
}

/** Sandbox cgroups that currently exist for this runtime instance, in any hierarchy. */
export function liveSandboxCgroups(runtime: Runtime): string[] {
  const instance = path.basename(runtime.runDir)
  const found: string[] = []
  for (const h of cgroupHierarchies()) {
    const dir = path.join('/sys/fs/cgroup', h, 'cairn', instance)
    if (!existsSync(dir)) continue
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      if (entry.isDirectory()) found.push(path.join(dir, entry.name))
    }
  }
  return found
}

function cgroupHierarchies(): string[] {
  return ['unified', 'memory', 'pids', 'cpu', 'freezer'].filter((h) =>
    existsSync(path.join('/sys/fs/cgroup', h)),
  )
}

/**
 * Host processes whose cgroup belongs to this runtime instance. Zombies are left out unless asked
 * for: when an agent exits on its own, bwrap's outer process exits as soon as its inner init
 * reports the status, so that init is reaped by the host's PID 1 (here within ~1.5 s). A zombie
 * holds no memory, file, mount or live cgroup. Kills the runtime starts leave no zombie at all;
 * `except` leaves out processes seen before (zombies of earlier tests still waiting for PID 1).
 */
export function instanceProcesses(
  runtime: Runtime,
  options: { zombies?: boolean; except?: Iterable<number> } = {},
): number[] {
  const except = new Set(options.except ?? [])
  const instance = path.basename(runtime.runDir)
  const pids: number[] = []
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue
    try {
      const cgroup = readFileSync(`/proc/${entry}/cgroup`, 'utf8')
      if (!cgroup.includes(`/cairn/${instance}/`)) continue
      const zombie = /^State:\s+Z/m.test(readFileSync(`/proc/${entry}/status`, 'utf8'))
      if ((!zombie || options.zombies) && !except.has(Number(entry))) pids.push(Number(entry))
    } catch {
      // exited while we looked
    }
  }
  return pids
}

export async function waitFor(check: () => boolean | Promise<boolean>, timeoutMs = 3000): Promise<boolean> {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (await check()) return true
    await new Promise((r) => setTimeout(r, 25))
  }
  return check()
}
