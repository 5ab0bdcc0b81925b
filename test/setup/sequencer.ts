import { readFileSync } from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { BaseSequencer, type TestSpecification } from 'vitest/node'

/**
 * Starts the longest test files first, so that the two workers end together instead of one
 * running a long file alone at the end of a pass. Vitest's own order on a clean clone (no results
 * cache) is by file size, which put the single-server model test (~80 s) near the end of the
 * SQLite pass, and in the PostgreSQL pass its results cache put the cluster files last (skipped on
 * SQLite, so ~0 s there, ~50 s each here): each pass's last ~60 s ran one file at a time.
 *
 * The seconds per file and pass (everything a worker spends on the file: setup, import, tests and
 * hooks) are in file-durations.json, written from a run's test-results by
 * `node scripts/test-timings.mjs --write-durations`. A file not in it (a new one) is placed as if
 * it took UNKNOWN_FILE_S; a file that grew slower only costs its pass a tail until the list is
 * written again.
 */
const DURATIONS_PATH = fileURLToPath(new URL('./file-durations.json', import.meta.url))
/** Longer than most files (the median is ~4 s), so a new file is not left for the tail. */
const UNKNOWN_FILE_S = 15

type Durations = Record<string, Record<string, number>>

function readDurations(): Durations {
  try {
    return JSON.parse(readFileSync(DURATIONS_PATH, 'utf8')) as Durations
  } catch {
    return {}
  }
}

/** The pass whose durations order this run: the one `CAIRN_TEST_DATABASE` names. */
export function testPass(): 'postgres' | 'sqlite' {
  return process.env.CAIRN_TEST_DATABASE === 'postgres' ? 'postgres' : 'sqlite'
}

export class LongestFirstSequencer extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const seconds = readDurations()[testPass()] ?? {}
    const root = this.ctx.config.root
    const estimateS = (file: TestSpecification) =>
      seconds[path.relative(root, file.moduleId)] ?? UNKNOWN_FILE_S
    return [...files].sort((a, b) => estimateS(b) - estimateS(a))
  }
}
