import { readdirSync, readFileSync } from 'node:fs'

/**
 * Bytes of file data a set of processes (and every process they have reaped) dirtied, from
 * `/proc/<pid>/io` `write_bytes`: the kernel counts a page there, for the task that dirtied it, the
 * moment a `write()` or a store through a shared mapping makes it dirty — long before the data
 * reaches the filesystem's trees. Tasks fold their counters into their parent's when reaped, so
 * the sum over the live processes of a sandbox, plus its not-yet-reaped zombies (found through
 * their parents' `children` lists, since a cgroup no longer lists them), only ever grows.
 *
 * Undefined when any of them could not be read (a process vanished while counting): the caller
 * must then assume something was written.
 */
export function dirtiedBytes(livePids: readonly number[]): number | undefined {
  if (livePids.length === 0) return undefined
  const pids = new Set(livePids)
  try {
    for (const pid of livePids) {
      for (const tid of readdirSync(`/proc/${pid}/task`)) {
        const children = readFileSync(`/proc/${pid}/task/${tid}/children`, 'utf8').trim()
        if (children) for (const child of children.split(' ')) pids.add(Number(child))
      }
    }
    return writeBytesOf([...pids])
  } catch {
    return undefined
  }
}

/**
 * The sum of `write_bytes` over exactly these processes (their reaped children included, not
 * their zombies); undefined when one could not be read.
 */
export function writeBytesOf(pids: readonly number[]): number | undefined {
  let total = 0
  try {
    for (const pid of pids) {
      const match = /^write_bytes: (\d+)$/m.exec(readFileSync(`/proc/${pid}/io`, 'utf8'))
      if (!match) return undefined
      total += Number(match[1])
    }
  } catch {
    return undefined
  }
  return total
}
