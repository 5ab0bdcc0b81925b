import type { CommandInfo, Commands } from '@cairn/sdk'
import type { Shell, ShellAction, ShellOutputResult, ShellResult } from '@openai/agents'
import { ClippedText, shareLimit } from './output.js'

/** Characters of a command's output given back when the model names no `max_output_length`. */
export const DEFAULT_MAX_OUTPUT_CHARS = 64 * 1024

export interface CairnShellOptions {
  /** The program each command line is given to, the line appended (default `['sh', '-c']`). */
  shell?: readonly string[] | undefined
  /** Directory the commands run in, relative to /workspace (default: /workspace). */
  cwd?: string | undefined
  /** Variables added to the session's environment. */
  env?: Record<string, string> | undefined
  /** A command's time limit when the model names none (default: the server's, 10 minutes). */
  timeoutMs?: number | undefined
  /** Characters of a command's stdout and stderr together when the model names no limit. */
  maxOutputChars?: number | undefined
}

/**
 * The Agents SDK's `Shell` (for `shellTool`) on a Cairn session: each command line of a shell call
 * runs as a command in the session's sandbox (docs/commands.md), on its `/workspace`, under its
 * limits, network policy and secrets; the sandbox is started if it is cold.
 */
export class CairnShell implements Shell {
  private readonly argv: readonly string[]

  constructor(
    private readonly session: { readonly commands: Commands },
    private readonly options: CairnShellOptions = {},
  ) {
    this.argv = options.shell ?? ['sh', '-c']
  }

  /** Runs the lines in order; a line that times out ends the call (the model decides what next). */
  async run(action: ShellAction): Promise<ShellResult> {
    const limitChars = action.maxOutputLength ?? this.options.maxOutputChars ?? DEFAULT_MAX_OUTPUT_CHARS
    const output: ShellOutputResult[] = []
    for (const line of action.commands) {
      const result = await this.runLine(line, action.timeoutMs ?? this.options.timeoutMs, limitChars)
      output.push(result)
      if (result.outcome.type === 'timeout') break
    }
    return { output, maxOutputLength: limitChars }
  }

  private async runLine(
    line: string,
    timeoutMs: number | undefined,
    limitChars: number,
  ): Promise<ShellOutputResult> {
    const { cwd, env } = this.options
    const started = await this.session.commands.start([...this.argv, line], { cwd, env, timeoutMs })
    const stdout = new ClippedText(limitChars)
    const stderr = new ClippedText(limitChars)
    const ended = await this.session.commands.wait(started.id, {
      onOutput: (event) => {
        if (event.type === 'output') (event.stream === 'stdout' ? stdout : stderr).push(event.data)
      },
    })
    stdout.end()
    stderr.end()
    const [outChars, errChars] = shareLimit(limitChars, stdout.totalChars, stderr.totalChars)
    const err = stderr.clip(errChars)
    const note = endNote(ended)
    return {
      command: line,
      stdout: stdout.clip(outChars),
      stderr: err && note ? `${err}\n${note}` : err + note,
      outcome:
        ended.endCause === 'timeout' ? { type: 'timeout' } : { type: 'exit', exitCode: ended.exitCode },
    }
  }
}

/** Why a command ended when it was not its own doing (a signal, its sandbox stopped), for the model. */
function endNote(command: CommandInfo): string {
  if (command.endCause === 'exit' || command.endCause === 'timeout') return ''
  if (command.status === 'lost') return '[cairn: the command was lost with its node]'
  if (command.endCause === 'sandbox_stopped') return '[cairn: the sandbox stopped and the command with it]'
  return command.signal ? `[cairn: the command was killed by ${command.signal}]` : ''
}
