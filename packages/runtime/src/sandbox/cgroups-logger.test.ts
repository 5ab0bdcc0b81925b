import { randomBytes } from 'node:crypto'
import { existsSync } from 'node:fs'
import { describe, expect, it } from 'vitest'
import type { Logger } from '../util/logger.js'
import { CgroupManager } from './cgroups.js'

/** A logger that keeps what it is given. */
function recordingLogger(): Logger & { lines: { level: string; fields: object; message?: string }[] } {
  const lines: { level: string; fields: object; message?: string }[] = []
  const at = (level: string) => (fields: object, message?: string) =>
    void lines.push({ level, fields, message })
  return { lines, debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') }
}

describe('CgroupManager logger', () => {
  it('logs a scope it could not remove (a sandbox cgroup still in it) and keeps it', async () => {
    const logger = recordingLogger()
    const cgroups = new CgroupManager(`cairn/logger-test-${randomBytes(4).toString('hex')}`, logger)
    await cgroups.create('held', { memoryBytes: 64 * 1024 * 1024, pids: 16, cpus: 1 })
    const warnings = () => logger.lines.filter((l) => l.message === 'left a cgroup scope in place')
    let kept = 0
    try {
      await cgroups.removeScope()
      const warning = logger.lines.find((l) => l.message === 'left a cgroup scope in place')
      expect(warning, JSON.stringify(logger.lines)).toBeDefined()
      expect(warning?.level).toBe('warn')
      const { dir } = (warning?.fields ?? {}) as { dir?: string }
      expect(dir && existsSync(dir)).toBe(true)
      kept = warnings().length
    } finally {
      await cgroups.remove('held')
      await cgroups.removeScope()
    }
    expect(await cgroups.list()).toEqual([])
    // Once its sandbox cgroup is gone the scope goes too, with nothing more to report.
    expect(warnings()).toHaveLength(kept)
  })
})
