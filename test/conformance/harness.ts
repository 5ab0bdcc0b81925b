import { existsSync, readdirSync, readFileSync } from 'node:fs'
import path from 'node:path'
import type { AgentProtocolName } from '@cairn/protocol'
import type { AgentProcess } from '../../packages/runtime/src/agent/agent-process.js'
import type { AgentLaunch, TurnOutcome } from '../../packages/runtime/src/agent/types.js'
import type { Runtime } from '../../packages/runtime/src/runtime.js'
import type { IsolationName } from '../../packages/runtime/src/sandbox/driver.js'
import { probeGvisor } from '../../packages/runtime/src/sandbox/gvisor-driver.js'
import { sessionId, turn } from '../../packages/runtime/test/harness.js'

export {
  instanceProcesses,
  liveSandboxCgroups,
  makeRevision,
  openTestRuntime,
  reply,
  SANDBOX_UID,
  sessionId,
  type TestRuntime,
  turn,
  waitFor,
} from '../../packages/runtime/test/harness.js'

export const DRIVERS: readonly IsolationName[] = ['bwrap', 'gvisor']

export type DriverState = { ok: true } | { ok: false; reason: string }

/**
 * Whether each driver can run on this machine. bwrap always can here (the runtime tests need it);
 * gVisor is tried once with a throwaway sandbox, and when it cannot run its cases are skipped with
 * the reason printed, never reported as passed.
 */
export async function probeDrivers(): Promise<Record<IsolationName, DriverState>> {
  const gvisor = await probeGvisor()
  if (!gvisor.ok) {
    console.warn(`conformance: gVisor cannot run on this machine, its cases are SKIPPED: ${gvisor.reason}`)
  }
  return { bwrap: { ok: true }, gvisor: gvisor.ok ? { ok: true } : { ok: false, reason: gvisor.reason } }
}

export interface StartOptions {
  protocol?: AgentProtocolName
  memoryMiB?: number
  pids?: number
  cpus?: number
  turnTimeoutMs?: number
  env?: Record<string, string>
  workspaceDir?: string
  egress?: AgentLaunch['egress']
  binds?: AgentLaunch['binds']
}

/** Starts an agent under `isolation` on a fresh workspace of `revisionId` (or on `workspaceDir`). */
export async function startOn(
  runtime: Runtime,
  isolation: IsolationName,
  revisionId: string,
  command: string[],
  options: StartOptions = {},
): Promise<{ agent: AgentProcess; workspaceDir: string; sessionId: string }> {
  const id = sessionId('c')
  const workspaceDir = options.workspaceDir ?? (await runtime.pool.createWorkspace(id, revisionId))
  const agent = await runtime.startAgent({
    sessionId: id,
    workspaceDir,
    command,
    protocol: options.protocol ?? 'stdio',
    env: options.env ?? {},
    limits: { memoryMiB: options.memoryMiB ?? 256, pids: options.pids ?? 64, cpus: options.cpus ?? 1 },
    turnTimeoutMs: options.turnTimeoutMs ?? 20_000,
    isolation,
    egress: options.egress,
    binds: options.binds,
  })
  return { agent, workspaceDir, sessionId: id }
}

/** Runs a one-shot script (exec protocol) under `isolation` on `workspaceDir`. */
export async function runOn(
  runtime: Runtime,
  isolation: IsolationName,
  workspaceDir: string,
  script: string,
  options: { shell?: 'bash' | 'python3'; input?: string } = {},
): Promise<TurnOutcome> {
  const command = options.shell === 'python3' ? ['python3', '-c', script] : ['bash', '-c', script]
  const { agent } = await startOn(runtime, isolation, '', command, { protocol: 'exec', workspaceDir })
  try {
    return (await turn(agent, options.input ?? '', 1)).outcome
  } finally {
    await runtime.stopAgent(agent)
  }
}

export function completedText(outcome: TurnOutcome): string {
  if (outcome.status !== 'completed') throw new Error(`sandbox script failed: ${JSON.stringify(outcome)}`)
  return outcome.text
}

/** The sandbox's cgroup directories in the hierarchies that carry limits (v1 here, or v2). */
/**
 * The cgroup name of the sandbox whose process is `pid` (a sandbox started from a spare launcher
 * lives in a cgroup that is not named after the sandbox).
 */
export function sandboxCgroupName(runtime: Runtime, pid: number | undefined): string {
  const instance = `/cairn/${path.basename(runtime.runDir)}/`
  const line = readFileSync(`/proc/${pid}/cgroup`, 'utf8')
    .split('\n')
    .find((l) => l.includes(instance))
  const name = line?.slice(line.indexOf(instance) + instance.length).split('/')[0]
  if (!name) throw new Error(`process ${pid} is in no cgroup of this runtime`)
  return name
}

/** The limit cgroup directories named `cgroupName` (a sandbox id, see `sandboxCgroupName`). */
export function limitCgroupDirs(runtime: Runtime, cgroupName: string): Record<string, string> {
  const instance = path.basename(runtime.runDir)
  const dirs: Record<string, string> = {}
  for (const h of ['memory', 'pids', 'cpu', 'unified']) {
    const dir = path.join('/sys/fs/cgroup', h, 'cairn', instance, cgroupName)
    if (existsSync(dir)) dirs[h] = dir
  }
  return dirs
}

/** Mount points on the host that belong to this runtime's sandboxes (there must be none). */
export function sandboxMounts(runtime: Runtime): string[] {
  const mountinfo = readFileSync('/proc/self/mountinfo', 'utf8')
  return mountinfo
    .split('\n')
    .map((line) => line.split(' ')[4] ?? '')
    .filter((mountPoint) => mountPoint.startsWith(runtime.runDir) && mountPoint !== runtime.pool.root)
}

/** gVisor state left on the host: runsc containers and bundles of this runtime (there must be none). */
export function gvisorLeftovers(runtime: Runtime): string[] {
  const left: string[] = []
  for (const sub of ['runsc', 'bundles']) {
    const dir = path.join(runtime.runDir, 'gvisor', sub)
    if (existsSync(dir)) left.push(...readdirSync(dir).map((name) => `${sub}/${name}`))
  }
  return left
}
