import { afterAll } from 'vitest'
import { removeScratchDirs } from '../helpers/scratch.js'

/**
 * Runs around every test file. A worker runs many files in one process (`isolate: false` in
 * vitest.config.ts), so what a file changes in the process must not reach the next one: the
 * projects and scratch directories it wrote are removed, and the environment is put back as the
 * file found it (a test bed that sets the object store's credentials, a case that unsets
 * CAIRN_DATABASE_URL).
 */
const envAtStart = { ...process.env }

afterAll(async () => {
  await removeScratchDirs()
  restoreEnv(envAtStart)
})

function restoreEnv(saved: NodeJS.ProcessEnv): void {
  for (const name of Object.keys(process.env)) {
    if (!(name in saved)) delete process.env[name]
  }
  for (const [name, value] of Object.entries(saved)) {
    if (value !== undefined && process.env[name] !== value) process.env[name] = value
  }
}
