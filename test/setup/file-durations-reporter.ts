import { mkdirSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import type { Reporter, TestModule } from 'vitest/node'
import { testPass } from './sequencer.js'

/**
 * Writes test-results/<pass>.files.json: each test file's seconds in a worker (its setup, its
 * import, its tests and its hooks). Vitest's JSON report counts a file from its first test's start
 * to its last test's end, so a file whose time is in beforeAll (a test bed, image builds) shows
 * far less there than it costs the run. scripts/test-timings.mjs prints these when present;
 * `--write-durations` copies them into test/setup/file-durations.json for the sequencer.
 */
export default class FileDurationsReporter implements Reporter {
  onTestRunEnd(modules: ReadonlyArray<TestModule>): void {
    const seconds: Record<string, number> = {}
    for (const module of modules) {
      const d = module.diagnostic()
      const ms =
        d.environmentSetupDuration + d.prepareDuration + d.setupDuration + d.collectDuration + d.duration
      seconds[path.relative(process.cwd(), module.moduleId)] = Math.round(ms / 100) / 10
    }
    mkdirSync('test-results', { recursive: true })
    writeFileSync(
      path.join('test-results', `${testPass()}.files.json`),
      `${JSON.stringify(seconds, null, 2)}\n`,
    )
  }
}
