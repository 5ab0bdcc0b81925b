import { CommanderError } from 'commander'
import { extractGlobalFlags, useColor } from './argv.js'
import { Context } from './context.js'
import { CliError, EXIT } from './errors.js'
import { errorInfo, hintFor } from './format/errors.js'
import { Output } from './output.js'
import { buildProgram } from './program.js'
import { refuseUnknownSubcommand } from './suggest.js'

function commanderExit(error: CommanderError): number {
  if (error.code === 'commander.helpDisplayed' || error.code === 'commander.version') return EXIT.ok
  return EXIT.usage
}

/** Prints an error (`✗ message` and a hint on stderr; with `--json` also `{error}` on stdout) and picks the exit code. */
function report(ctx: Context, error: unknown): number {
  if (error instanceof CommanderError) return commanderExit(error)
  const exitCode = error instanceof CliError ? error.exitCode : EXIT.error
  // An empty CliError only carries an exit code: what went wrong was printed already.
  if (error instanceof CliError && error.message === '') return exitCode
  const info = errorInfo(error)
  ctx.out.error(error, ctx.apiUrl)
  if (ctx.json && exitCode !== EXIT.cancelled) {
    const hint =
      error instanceof CliError && error.hint
        ? error.hint
        : hintFor(info.code, ctx.apiUrl ? { apiUrl: ctx.apiUrl } : {})
    ctx.out.record({
      error: { code: info.code ?? 'error', message: info.message, ...(hint ? { hint } : {}) },
    })
  }
  if (ctx.env.CAIRN_DEBUG && error instanceof Error && error.stack) process.stderr.write(`${error.stack}\n`)
  return exitCode
}

/** Runs the CLI on `argv` (as in `process.argv`) and returns the exit code. */
export async function main(
  argv: string[] = process.argv,
  env: NodeJS.ProcessEnv = process.env,
): Promise<number> {
  const { args, flags } = extractGlobalFlags(argv.slice(2))
  const color = {
    stdout: useColor(flags.color, env, process.stdout.isTTY === true),
    stderr: useColor(flags.color, env, process.stderr.isTTY === true),
  }
  const out = new Output({ json: flags.json, color })
  const ctx = new Context(flags, env, out)
  try {
    const program = await buildProgram(ctx, args)
    refuseUnknownSubcommand(program, args)
    await program.parseAsync(args, { from: 'user' })
    return EXIT.ok
  } catch (error) {
    return report(ctx, error)
  }
}

/** The `cairn` binary: runs, flushes stdout and stderr, exits with the code. */
export async function run(): Promise<never> {
  const code = await main()
  const flush = (stream: NodeJS.WriteStream) =>
    new Promise<void>((resolve) => stream.write('', () => resolve()))
  await Promise.all([flush(process.stdout), flush(process.stderr)])
  process.exit(code)
}
