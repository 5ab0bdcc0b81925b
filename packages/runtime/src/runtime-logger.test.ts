import { execFileSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import { mkdir, mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { Runtime } from './runtime.js'
import type { Logger } from './util/logger.js'

const dirs: string[] = []
const mounts: string[] = []

afterAll(async () => {
  for (const mount of mounts) execFileSync('umount', [mount])
  for (const dir of dirs) await rm(dir, { recursive: true, force: true })
})

/** A logger that keeps what it is given. */
function recordingLogger(): Logger & { lines: { level: string; fields: object; message?: string }[] } {
  const lines: { level: string; fields: object; message?: string }[] = []
  const at = (level: string) => (fields: object, message?: string) =>
    void lines.push({ level, fields, message })
  return { lines, debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') }
}

describe('Runtime logger', () => {
  it('logs a cleanup it could not do (the run dir kept while still mounted) instead of dropping it', async () => {
    const dataDir = await mkdtemp(path.join(tmpdir(), 'cairn-rt-log-'))
    const runBase = await mkdtemp(path.join(tmpdir(), 'cairn-rt-log-run-'))
    dirs.push(dataDir, runBase)
    const logger = recordingLogger()
    const runtime = new Runtime({ dataDir, storage: 'dir', runBase, logger })
    await runtime.open()
    // Something still mounted under the run dir: close must keep it, and say so.
    const held = path.join(runtime.runDir, 'held')
    await mkdir(held)
    execFileSync('mount', ['-t', 'tmpfs', 'tmpfs', held])
    mounts.push(held)
    await runtime.close()
    expect(existsSync(held)).toBe(true)
    const warning = logger.lines.find((l) => l.message === 'left the run dir in place: still mounted')
    expect(warning, JSON.stringify(logger.lines)).toBeDefined()
    expect(warning?.level).toBe('warn')
    expect(warning?.fields).toMatchObject({ runDir: runtime.runDir })
  })
})
