import { afterAll } from 'vitest'
import { removeScratchDirs } from '../helpers/scratch.js'

// Runs after every test file: the projects and scratch directories it wrote do not outlive it.
afterAll(async () => {
  await removeScratchDirs()
})
