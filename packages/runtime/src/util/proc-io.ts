import { closeSync, openSync, readdirSync, readSync } from 'node:fs'

/** One buffer for the small kernel files read on a turn's path (read synchronously, one at a time). */
const chunk = Buffer.alloc(4096)

/**
 * A small kernel file (/proc, cgroup) read whole: an open, a read (more only while they fill the
 * buffer: a kernel file's read returns what it has up to the size asked) and a close, where
 * `readFileSync` reads once more to see the end.
 */
export function readKernelFile(file: string): string {
  const fd = openSync(file, 'r')
  try {
    let text = ''
    for (;;) {
      const read = readSync(fd, chunk, 0, chunk.length, null)
      text += chunk.toString('latin1', 0, read)
      if (read < chunk.length) return text
    }
  } finally {
    closeSync(fd)
  }
}

/**
 * Bytes of file data a set of processes (and every process they have reaped) dirtied, from
 * `/proc/<pid>/io` `write_bytes`: the kernel counts a page there, for the task that dirtied it, the
 * moment a `write()` or a store through a shared mapping makes it dirty — long before the data
 * reaches the filesystem's trees. Tasks fold their counters into their parent's when reaped, so
 * the sum over the live processes of a sandbox, plus its not-yet-reaped zombies (found through
 * their parents' `children` lists, since a cgroup no longer lists them), only ever grows.
 * `liveTids`, the threads of the same cgroup read just after: when they are exactly `livePids`,
 * every process has one thread, itself, and its task list is not read.
 *
 * Undefined when any of them could not be read (a process vanished while counting): the caller
 * must then assume something was written.
 */
export function dirtiedBytes(livePids: readonly number[], liveTids?: readonly number[]): number | undefined {
  if (livePids.length === 0) return undefined
  const pids = new Set(livePids)
  const single = liveTids !== undefined && sameSet(pids, liveTids)
  try {
    for (const pid of livePids) {
      for (const tid of single ? [pid] : readdirSync(`/proc/${pid}/task`)) {
        const children = readKernelFile(`/proc/${pid}/task/${tid}/children`).trim()
        if (children) for (const child of children.split(' ')) pids.add(Number(child))
      }
    }
    return writeBytesOf([...pids])
  } catch {
    return undefined
  }
}

/** Whether `b` holds exactly the numbers of `a` (each once). */
function sameSet(a: ReadonlySet<number>, b: readonly number[]): boolean {
  return b.length === a.size && new Set(b).size === b.length && b.every((n) => a.has(n))
}

/**
 * The sum of `write_bytes` over exactly these processes (their reaped children included, not
 * their zombies); undefined when one could not be read.
 */
export function writeBytesOf(pids: readonly number[]): number | undefined {
  let total = 0
  try {
    for (const pid of pids) {
      const match = /^write_bytes: (\d+)$/m.exec(readKernelFile(`/proc/${pid}/io`))
      if (!match) return undefined
      total += Number(match[1])
    }
  } catch {
    return undefined
  }
  return total
}
