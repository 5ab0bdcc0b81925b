import { readdirSync, readFileSync } from 'node:fs'

/** A process's CPU so far: its command and the ns its threads have run. */
export interface ProcessCpu {
  comm: string
  cpuNs: number
}

/** The parent of each live process, and its command. */
function processTable(): Map<number, { parent: number; comm: string }> {
  const table = new Map<number, { parent: number; comm: string }>()
  for (const entry of readdirSync('/proc')) {
    const pid = Number(entry)
    if (!Number.isInteger(pid)) continue
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
      const close = stat.lastIndexOf(')')
      const parent = Number(stat.slice(close + 2).split(' ')[1])
      table.set(pid, { parent, comm: stat.slice(stat.indexOf('(') + 1, close) })
    } catch {
      // Gone meanwhile.
    }
  }
  return table
}

/** ns on a CPU of every thread of `pid` (`/proc/<pid>/task/<tid>/schedstat`, its first field). */
function threadsCpuNs(pid: number): number {
  let total = 0
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      total += Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ')[0])
    } catch {
      // A thread that ended meanwhile.
    }
  }
  return total
}

/**
 * `root` and every live process under it (its helpers, launchers and sandboxes), by pid, with
 * the CPU its threads have used: read before and after a loop of requests, what the loop cost
 * the machine, which a loaded machine's scheduling delays do not inflate as they do wall time.
 */
export function cpuTree(root: number): Map<number, ProcessCpu> {
  const table = processTable()
  const out = new Map<number, ProcessCpu>()
  for (const [pid, { comm }] of table) {
    let p: number | undefined = pid
    while (p !== undefined && p > 1 && p !== root) p = table.get(p)?.parent
    if (p !== root) continue
    try {
      out.set(pid, { comm, cpuNs: threadsCpuNs(pid) })
    } catch {
      // Gone meanwhile.
    }
  }
  return out
}

/** ms of CPU used between two `cpuTree` readings, by command (a process new since `before` counts whole). */
export function cpuSpentMs(
  before: Map<number, ProcessCpu>,
  after: Map<number, ProcessCpu>,
): Map<string, number> {
  const by = new Map<string, number>()
  for (const [pid, now] of after) {
    const spent = now.cpuNs - (before.get(pid)?.cpuNs ?? 0)
    by.set(now.comm, (by.get(now.comm) ?? 0) + spent / 1e6)
  }
  return by
}
