import { type ChildProcess, spawn } from 'node:child_process'
import { once } from 'node:events'
import { mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { createInterface } from 'node:readline'
import { afterAll, describe, expect, it } from 'vitest'
import { dirtiedBytes, writeBytesOf } from './proc-io.js'

// A process (one thread, or two) whose child wrote 64 KiB to a file on a disk-backed filesystem
// and exited, left unreaped (a zombie: its count is not its parent's yet, and no cgroup lists it).
const PARENT = `
import os, sys, threading, time
if sys.argv[1] == 'threads':
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
pid = os.fork()
if pid == 0:
    with open(sys.argv[2], 'wb') as f:
        f.write(b'x' * 65536)
    os._exit(0)
os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
print('ready', flush=True)
time.sleep(60)
`
const WRITTEN = 65536
const dir = mkdtempSync(path.join(tmpdir(), 'cairn-proc-io-'))
const started: ChildProcess[] = []

afterAll(async () => {
  for (const child of started) {
    child.kill('SIGKILL')
    if (child.exitCode === null && child.signalCode === null) await once(child, 'exit')
  }
  rmSync(dir, { recursive: true, force: true })
})

async function parentOfZombie(threads: 'one' | 'threads'): Promise<number> {
  const child = spawn('python3', ['-c', PARENT, threads, path.join(dir, threads)], {
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  started.push(child)
  for await (const line of createInterface({ input: child.stdout })) if (line === 'ready') break
  return child.pid as number
}

describe('dirtiedBytes', () => {
  it.each(['one', 'threads'] as const)(
    "counts an unreaped child's writes with its parent's, whose tasks the cgroup's thread list shows (%s)",
    async (threads) => {
      const pid = await parentOfZombie(threads)
      const tids = readdirSync(`/proc/${pid}/task`).map(Number)
      expect(tids).toHaveLength(threads === 'one' ? 1 : 2)
      const live = writeBytesOf([pid]) ?? Number.NaN
      // The thread list says whether each process's tasks must be listed: right either way.
      expect((dirtiedBytes([pid], tids) ?? 0) - live).toBeGreaterThanOrEqual(WRITTEN)
      expect((dirtiedBytes([pid]) ?? 0) - live).toBeGreaterThanOrEqual(WRITTEN)
    },
  )
})
