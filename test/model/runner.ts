import fc from 'fast-check'
import { describe, it } from 'vitest'
import { makeProject, SHELL_PROJECT } from '../helpers/projects.js'
import { packDir } from '../helpers/server.js'
import { Violation } from './client.js'
import { emptyFiles, Model, PATHS } from './model.js'
import { AGENT } from './operations.js'
import type { Step } from './step.js'
import { checkInvariants, type Real, Stats } from './system.js'
import { openTurn, writeCommand } from './turns.js'

/**
 * The model-based fault test's loop (docs/architecture.md, "The model-based fault test"), shared
 * by its test beds (one `cairn server`; the cluster): sequences of operations and faults against
 * the bed's system, every invariant checked after each step.
 * CAIRN_MODEL_SEED / CAIRN_MODEL_PATH (and CAIRN_MODEL_REPLAY, the commands' replayPath): replay
 * a failure as printed; CAIRN_MODEL_STEPS: most steps in a sequence. The budget (wall time for
 * all sequences; then it stops, passing if none failed) and the default steps are the bed's.
 */
const SEED_SET = process.env.CAIRN_MODEL_SEED ? Number(process.env.CAIRN_MODEL_SEED) : undefined
const PATH = process.env.CAIRN_MODEL_PATH || undefined
const REPLAY = process.env.CAIRN_MODEL_REPLAY || undefined
const STEPS = process.env.CAIRN_MODEL_STEPS ? Number(process.env.CAIRN_MODEL_STEPS) : undefined
/**
 * The soak's way (`npm run soak`): a failing sequence is reported (its message, its seed and
 * path, which replay it) and the next one runs, instead of shrinking it and stopping; the test
 * fails at the end if any failed.
 */
const KEEP_GOING = process.env.CAIRN_MODEL_KEEP_GOING === '1'

/** A system the sequences run on: started (or made ready again) for each, left after each. */
export interface Bed<S extends Real> {
  /** A system for one sequence; `pick` draws its choices in [0, 1) (which replica a request goes to). */
  begin(stats: Stats, pick: () => number): Promise<S>
  /** After the sequence's final check passed: the bed's own end-of-sequence checks. */
  finish(system: S): Promise<void>
  /** Whatever the outcome (`failed`: the sequence failed, keep its logs; `sequence`: as `[model] sequence N` prints it). */
  end(system: S | undefined, failed: boolean, seed: number, sequence: number): Promise<void>
  /** Once, after every sequence. */
  close(): Promise<void>
}

/** After the sequence: every live session still takes a turn that writes. */
async function finalCheck(model: Model, real: Real): Promise<void> {
  for (const session of model.live()) {
    const content = Buffer.from(`final ${session.id}`).toString('base64')
    const opened = await openTurn(real, session, writeCommand(PATHS[0], content))
    if ('refused' in opened) {
      throw new Violation(`final: ${session.label} refused a message: ${JSON.stringify(opened.refused.body)}`)
    }
    const outcome = await opened.turn.done
    real.stats.count(real.stats.invariants, 'usable at the end')
    if (outcome.terminal !== 'run.completed')
      throw new Violation(`final: ${session.label}'s turn ended ${outcome.terminal ?? 'without an end'}`)
    model.acknowledged(session, PATHS[0], content)
  }
  await checkInvariants(model, real)
}

/**
 * Runs the model test as a vitest case named `title` on `bed` for `budgetMs`. A sequence is never
 * cut short (fast-check's time-limit plugin would abandon it still running, its outcome ignored
 * and its system left behind): sequences begun after the deadline pass at once without starting
 * anything, so shrinking stops there too and the smallest failing sequence found so far is reported.
 */
export function describeModel<S extends Real>(options: {
  name: string
  title: string
  budgetMs: number
  /** Most steps in a sequence (CAIRN_MODEL_STEPS overrides it). */
  maxSteps: number
  /**
   * The seed CI (`CI` set) runs, so a red run is a change's doing and replays as printed;
   * elsewhere (and in `npm run soak`) a new seed each run explores new sequences.
   */
  ciSeed: number
  /** The system draws choices (which replica a request goes to) from the property's values. */
  choices?: boolean
  /** The vitest command that replays it (the test file's path). */
  file: string
  skip?: boolean
  bed: () => Promise<Bed<S>>
  steps: () => fc.Arbitrary<Step<S>>[]
}): void {
  const { budgetMs } = options
  const MAX_STEPS = STEPS ?? options.maxSteps
  const SEED = SEED_SET ?? (process.env.CI ? options.ciSeed : Date.now() % 2 ** 31)
  const log = (line: string) => process.stdout.write(`[${options.name}] ${line}\n`)
  describe.skipIf(options.skip ?? false)(options.name, () => {
    it(
      options.title,
      async () => {
        const archive = await packDir(await makeProject(SHELL_PROJECT))
        log(
          `seed ${SEED}${PATH ? ` path ${PATH}` : ''}, budget ${budgetMs} ms, at most ${MAX_STEPS} steps a sequence`,
        )
        const stats = new Stats()
        const failures: string[] = []
        const bed = await options.bed()
        const deadline = Date.now() + budgetMs
        const commands = fc.commands(options.steps(), {
          maxCommands: MAX_STEPS,
          size: 'max',
          ...(REPLAY ? { replayPath: REPLAY } : {}),
        })
        // The choices a sequence's system makes (which replica each request goes to) come from the
        // property's own values, so a replay by seed and path makes the same ones.
        const choices = options.choices
          ? fc.infiniteStream(fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true }))
          : fc.constant(undefined)
        const sequence = async (
          steps: Iterable<fc.AsyncCommand<Model, S>>,
          drawn: fc.Stream<number> | undefined,
        ) => {
          if (Date.now() > deadline) return
          const pick = drawn ? () => drawn.next().value as number : Math.random
          const run = stats.runs
          try {
            await runSequence(bed, stats, archive, steps, pick, SEED)
          } catch (error) {
            if (!KEEP_GOING) throw error
            const first = (error instanceof Error ? error.message : String(error)).split('\n')[0]
            failures.push(`CAIRN_MODEL_SEED=${SEED} CAIRN_MODEL_PATH=${run}: ${first?.slice(0, 300)}`)
          }
        }
        let details: fc.RunDetails<[Iterable<fc.AsyncCommand<Model, S>>, fc.Stream<number> | undefined]>
        try {
          const property = options.choices
            ? fc.asyncProperty(commands, choices, sequence)
            : fc.asyncProperty(commands, (steps) => sequence(steps, undefined))
          details = await fc.check(
            property as fc.IAsyncProperty<
              [Iterable<fc.AsyncCommand<Model, S>>, fc.Stream<number> | undefined]
            >,
            {
              seed: SEED,
              ...(PATH ? { path: PATH, endOnFailure: true } : {}),
              numRuns: PATH ? 1 : 100_000,
            },
          )
        } finally {
          await bed.close()
        }
        log(stats.summary())
        if (failures.length > 0)
          throw new Error(
            `${failures.length} sequences failed (each replays alone):\n${failures.join('\n')}\n\n${brokenLine(failures[0] ?? '')}`,
          )
        if (details.failed) {
          const cause =
            details.errorInstance instanceof Error
              ? details.errorInstance.message
              : String(details.errorInstance)
          const replay = `CAIRN_MODEL_STEPS=${MAX_STEPS} CAIRN_MODEL_SEED=${details.seed} CAIRN_MODEL_PATH=${details.counterexamplePath ?? ''} npx vitest run ${options.file}`
          // The cause and the replay first and again last: a log viewer that keeps only the head
          // and the tail of a long message (CI's) still shows which invariant broke.
          throw new Error(
            `${cause}\n\nReplay: ${replay}\n(and CAIRN_MODEL_REPLAY=<the counterexample's replayPath>)\n\n${fc.defaultReportMessage(details)}\n\n${brokenLine(cause)}\nReplay: ${replay}`,
          )
        }
        log(`every sequence passed (${stats.runs} in ${budgetMs} ms)`)
      },
      budgetMs + 900_000,
    )
  })
}

/**
 * A failure's closing lines, for a log that keeps only a message's tail: the broken invariant
 * (its message, up to 4 lines) and the step it broke at (Step.run adds the steps and the log after).
 */
export function brokenLine(message: string): string {
  const head = message.split('\n  steps: ')[0] ?? ''
  const lines = head.split('\n').map((line) => line.slice(0, 400))
  const shown = lines.length > 5 ? [...lines.slice(0, 4), ...lines.slice(-1)] : lines
  return `Broken invariant: ${shown.join('\n')}`
}

async function runSequence<S extends Real>(
  bed: Bed<S>,
  stats: Stats,
  archive: Buffer,
  steps: Iterable<fc.AsyncCommand<Model, S>>,
  pick: () => number,
  seed: number,
): Promise<void> {
  stats.runs += 1
  let real: S | undefined
  let failed = true
  try {
    real = await bed.begin(stats, pick)
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
    await bed.finish(real)
    failed = false
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error)
    process.stdout.write(`[model] sequence ${stats.runs}: ${message.slice(0, 4000)}\n`)
    throw error
  } finally {
    if (failed) process.stdout.write(`[model] sequence ${stats.runs} failed\n`)
    await bed.end(real, failed, seed, stats.runs)
  }
}
