import os from 'node:os'
import type { CommandInfo } from '@cairn/protocol'
import type { Commands } from '@cairn/sdk'
import { InvalidArgumentError } from 'commander'
import { duration, jsonOption, type Register } from '../../command.js'
import { CliError } from '../../errors.js'
import { resolveSession } from '../../session-arg.js'

const envPair = (value: string, previous: Record<string, string> = {}) => {
  const eq = value.indexOf('=')
  if (eq <= 0) throw new InvalidArgumentError('expected NAME=VALUE')
  return { ...previous, [value.slice(0, eq)]: value.slice(eq + 1) }
}

/** The command's exit status as a shell gives it: its code, 128 + the signal, 1 when lost. */
export function exitStatusOf(command: CommandInfo): number {
  if (command.exitCode !== null) return command.exitCode
  if (command.signal) return 128 + (os.constants.signals[command.signal as NodeJS.Signals] ?? 0)
  return 1
}

interface ExecOptions {
  cwd?: string
  env?: Record<string, string>
  timeout?: number
  interactive?: boolean
  detach?: boolean
}

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('exec')
      .description(
        "Run a command in a session's sandbox beside its agent (started if needed): streams its output, exits with its status",
      )
      .argument('<id>', 'session ID or a unique prefix of it')
      .argument('<command...>', 'the program and its arguments, after -- (no shell: use sh -c "…" for one)')
      .option('--cwd <dir>', 'directory to run in, under /workspace')
      .option('-e, --env <NAME=VALUE>', 'a variable to add (repeatable)', envPair)
      .option('--timeout <duration>', 'kill it after this long (default 10m)', duration)
      .option('-i, --interactive', "send this terminal's stdin to the command")
      .option('-d, --detach', 'print its ID and leave it running'),
  ).action(async (id: string, argv: string[], options: ExecOptions) => {
    const session = await resolveSession(ctx, id)
    const commands = session.commands
    const started = await commands.start(argv, {
      cwd: options.cwd,
      env: options.env,
      timeoutMs: options.timeout,
      stdin: options.interactive === true,
    })
    if (options.detach) {
      if (ctx.json) return ctx.out.data(started)
      ctx.out.line(started.id)
      return
    }
    if (options.interactive) void pumpStdin(commands, started.id)
    // Ctrl-C goes to the command (as in a terminal); the stream goes on until it ends.
    const forward = () => void commands.signal(started.id, 'SIGINT').catch(() => undefined)
    process.on('SIGINT', forward)
    let ended: CommandInfo
    try {
      ended = await commands.wait(started.id, {
        onOutput: (event) => {
          if (event.type === 'output' && !ctx.json)
            (event.stream === 'stdout' ? ctx.out.stdout : ctx.out.stderr).write(event.data)
          if (event.type === 'gap') ctx.out.note(`[${event.to - event.from} bytes of output no longer kept]`)
        },
      })
    } finally {
      process.off('SIGINT', forward)
    }
    if (ctx.json) ctx.out.data(ended)
    const status = exitStatusOf(ended)
    if (status !== 0) throw new CliError('', { exitCode: status })
  })
}

/** Sends this process's stdin to the command as it comes, and closes the command's at its end. */
async function pumpStdin(commands: Commands, commandId: string): Promise<void> {
  try {
    for await (const chunk of process.stdin) await commands.sendStdin(commandId, chunk as Buffer)
    await commands.closeStdin(commandId)
  } catch {
    // The command ended first (its stdin closed): what is left of ours goes nowhere.
  }
}
