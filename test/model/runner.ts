import { copyFile, mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { instanceRunDir } from '@cairn/runtime'
import fc from 'fast-check'
import { afterAll, describe, it } from 'vitest'
import { makeProject, SHELL_PROJECT } from '../helpers/projects.js'
import { releasePoolImage } from '../helpers/scratch.js'
import { packDir } from '../helpers/server.js'
import { Violation } from './client.js'
import { faults } from './faults.js'
import { emptyFiles, Model, PATHS } from './model.js'
import { AGENT, operations } from './operations.js'
import { mountsUnder, ServerProcess } from './server-process.js'
import type { Step } from './step.js'
import { checkInvariants, Real, STOP_BOUND_MS, Stats } from './system.js'
import { openTurn, writeCommand } from './turns.js'

/**
 * The model-based fault test (docs/architecture.md, "The model-based fault test"): sequences of
 * operations and faults against a real `cairn server`, every invariant checked after each step.
 * CAIRN_MODEL_BUDGET_MS: wall time for all sequences (then it stops, passing if none failed);
 * CAIRN_MODEL_SEED / CAIRN_MODEL_PATH (and CAIRN_MODEL_REPLAY, the commands' replayPath): replay
 * a failure as printed; CAIRN_MODEL_STEPS: most steps in a sequence.
 */
const BUDGET_MS = Number(process.env.CAIRN_MODEL_BUDGET_MS ?? 150_000)
/**
 * CI runs the sequences of one fixed seed (passed here 47 sequences in 15 min at load 15), so a
 * red run is a change's doing and replays as printed; elsewhere (and in `npm run soak`) a new
 * seed each run explores new sequences.
 */
const CI_SEED = 650280898
const SEED = process.env.CAIRN_MODEL_SEED
  ? Number(process.env.CAIRN_MODEL_SEED)
  : process.env.CI
    ? CI_SEED
    : Date.now() % 2 ** 31
const PATH = process.env.CAIRN_MODEL_PATH || undefined
const REPLAY = process.env.CAIRN_MODEL_REPLAY || undefined
const MAX_STEPS = Number(process.env.CAIRN_MODEL_STEPS ?? 24)

const stats = new Stats()
const workDirs = new Set<string>()

afterAll(async () => {
  for (const dir of workDirs) await teardown(dir)
})

/** Leaves nothing running or mounted for `workDir`'s data dir, then removes it. */
async function teardown(workDir: string, failed = false): Promise<void> {
  await ServerProcess.stopAll(workDir, STOP_BOUND_MS)
  if (failed) {
    const kept = path.join(os.tmpdir(), `cairn-model-${SEED}.log`)
    await copyFile(path.join(workDir, 'server.log'), kept).catch(() => undefined)
    process.stdout.write(
      `[model] sequence ${stats.runs} failed; its server log: ${kept} (the last failing one kept)\n`,
    )
  }
  const dataDir = ServerProcess.dataDirOf(workDir)
  if (mountsUnder(instanceRunDir(dataDir)).length > 0) {
    // A server killed last left its mounts: one started on the data dir takes them over and a
    // graceful stop removes them.
    const again = await ServerProcess.start(workDir).catch(() => undefined)
    await again?.stop(STOP_BOUND_MS)
  }
  releasePoolImage(path.join(dataDir, 'pool.img'))
  await rm(workDir, { recursive: true, force: true })
  workDirs.delete(workDir)
}

/** After the sequence: every live session still takes a turn that writes, and the server stops cleanly. */
async function finalCheck(model: Model, real: Real): Promise<void> {
  for (const session of model.live()) {
    const content = Buffer.from(`final ${session.id}`).toString('base64')
    const opened = await openTurn(real, session, writeCommand(PATHS[0], content))
    if ('refused' in opened) {
      throw new Violation(`final: ${session.label} refused a message: ${JSON.stringify(opened.refused.body)}`)
    }
    const outcome = await opened.turn.done
    stats.count(stats.invariants, 'usable at the end')
    if (outcome.terminal !== 'run.completed')
      throw new Violation(`final: ${session.label}'s turn ended ${outcome.terminal ?? 'without an end'}`)
    model.acknowledged(session, PATHS[0], content)
  }
  await checkInvariants(model, real)
  await real.stopAndCheck('pid')
}

/**
 * When the budget runs out. A sequence is never cut short (fast-check's time-limit plugin would
 * abandon it still running, its outcome ignored and its server left behind): sequences begun
 * after the deadline pass at once without starting anything, so shrinking stops there too and
 * the smallest failing sequence found so far is reported.
 */
let deadline = Number.POSITIVE_INFINITY

async function runSequence(archive: Buffer, steps: Iterable<Step>): Promise<void> {
  if (Date.now() > deadline) return
  stats.runs += 1
  const workDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-model-'))
  workDirs.add(workDir)
  let real: Real | undefined
  let failed = true
  try {
    real = await Real.start(workDir, stats)
    const deployed = await real.client.call('POST', '/v1/agents', archive, 'application/gzip')
    if (deployed.status !== 201)
      throw new Error(`deploy: ${deployed.status} ${JSON.stringify(deployed.body)}`)
    const model = new Model()
    model.retention = (await real.client.call('GET', '/v1/retention')).body
    // Two sessions to begin with (every sequence has something to work on; more come by create and fork).
    for (let i = 0; i < 2; i++)
      model.add((await real.client.call('POST', '/v1/sessions', { agent: AGENT })).body.id, emptyFiles())
    const system = real
    await fc.asyncModelRun(() => ({ model, real: system }), steps)
    await finalCheck(model, real)
    failed = false
  } finally {
    await teardown(workDir, failed)
  }
}

describe('model-based fault test', () => {
  it(
    'operations and faults against a real server keep every acknowledged write, strand nothing, answer no 5xx',
    async () => {
      const archive = await packDir(await makeProject(SHELL_PROJECT))
      const log = (line: string) => process.stdout.write(`[model] ${line}\n`)
      log(
        `seed ${SEED}${PATH ? ` path ${PATH}` : ''}, budget ${BUDGET_MS} ms, at most ${MAX_STEPS} steps a sequence`,
      )
      const commands = fc.commands([...operations(), ...faults()], {
        maxCommands: MAX_STEPS,
        size: 'max',
        ...(REPLAY ? { replayPath: REPLAY } : {}),
      })
      deadline = Date.now() + BUDGET_MS
      const details = await fc.check(
        fc.asyncProperty(commands, (steps) => runSequence(archive, steps as Iterable<Step>)),
        {
          seed: SEED,
          ...(PATH ? { path: PATH, endOnFailure: true } : {}),
          numRuns: PATH ? 1 : 100_000,
        },
      )
      log(stats.summary())
      if (details.failed) {
        const cause =
          details.errorInstance instanceof Error
            ? details.errorInstance.message
            : String(details.errorInstance)
        // The cause and the replay first: CI prints only a failure's first lines at its end.
        throw new Error(
          `${cause}\n\nReplay: CAIRN_MODEL_STEPS=${MAX_STEPS} CAIRN_MODEL_SEED=${details.seed} CAIRN_MODEL_PATH=${details.counterexamplePath ?? ''} npx vitest run test/model\n(and CAIRN_MODEL_REPLAY=<the counterexample's replayPath>)\n\n${fc.defaultReportMessage(details)}`,
        )
      }
      log(`every sequence passed (${stats.runs} in ${BUDGET_MS} ms)`)
    },
    BUDGET_MS + 600_000,
  )
})
