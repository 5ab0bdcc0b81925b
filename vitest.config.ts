import { fileURLToPath } from 'node:url'
import { defineConfig } from 'vitest/config'
import { LongestFirstSequencer } from './test/setup/sequencer'

const pkg = (name: string) => fileURLToPath(new URL(`./packages/${name}/src/index.ts`, import.meta.url))

export default defineConfig({
  resolve: {
    alias: {
      // Before '@cairn/protocol', which would otherwise take it as a subpath of its index.
      '@cairn/protocol/core': fileURLToPath(new URL('./packages/protocol/src/core.ts', import.meta.url)),
      '@cairn/protocol': pkg('protocol'),
      '@cairn/runtime/port': fileURLToPath(new URL('./packages/runtime/src/port/index.ts', import.meta.url)),
      '@cairn/runtime/doctor': fileURLToPath(
        new URL('./packages/runtime/src/doctor/index.ts', import.meta.url),
      ),
      '@cairn/runtime': pkg('runtime'),
      '@cairn/sdk': pkg('sdk'),
      '@cairn/openai-agents': pkg('openai-agents'),
      '@cairn/server': pkg('server'),
    },
  },
  test: {
    include: ['packages/*/src/**/*.test.ts', 'test/**/*.test.ts'],
    setupFiles: ['test/setup/cleanup.ts'],
    globalSetup: ['test/setup/postgres.ts'],
    pool: 'forks',
    // One process per worker runs file after file, its modules kept: importing the server costs a
    // file ~1 s otherwise (docs/benchmarks/ci.md). What a file leaves in the process (environment,
    // scratch directories) is undone after it (test/setup/cleanup.ts).
    isolate: false,
    testTimeout: 60_000,
    hookTimeout: 120_000,
    fileParallelism: true,
    maxWorkers: 2,
    // The longest files first (test/setup/file-durations.json), so that both workers end together.
    sequence: { sequencer: LongestFirstSequencer },
  },
})
