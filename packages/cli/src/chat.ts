import { createInterface } from 'node:readline'
import type { Session } from '@cairn/sdk'
import type { Context } from './context.js'
import { CancelledError, CliError, EXIT, UsageError } from './errors.js'
import { shortId } from './format/ids.js'
import { askLine, inForeground } from './prompt.js'
import { runTurn } from './turn.js'

export interface ChatOptions {
  /** Sent first. */
  prompt?: string | undefined
  /** One turn, then exit. */
  single?: boolean
}

const LEAVE = new Set(['exit', 'quit', '/exit', '/quit'])

/**
 * The conversation: the first prompt, then `You>`/`Agent>` on a terminal, or one turn per line of
 * piped stdin. Leaving (exit, Ctrl-D, an empty line) ends nothing: the session waits to be resumed.
 * Returns the exit code: 130 when a turn was cancelled, 1 when a non-interactive turn failed.
 */
export async function chat(ctx: Context, session: Session, options: ChatOptions = {}): Promise<number> {
  const onTerminal = process.stdin.isTTY === true
  // In the background (`cairn run agent "…" &`) the terminal is not ours to read: the prompt's turn
  // is the only one, and the terminal's modes are left alone (reading would stop the job).
  const background = onTerminal && !inForeground()
  const interactive = onTerminal && !background
  if (background && options.prompt === undefined) {
    throw new UsageError(
      'cairn run is in the background and has no message to send',
      'Give the first message as an argument: `cairn run <agent> "…" &`, or run it in the foreground.',
    )
  }
  let code: number = EXIT.ok
  const send = async (prompt: string): Promise<boolean> => {
    try {
      const result = await runTurn(ctx, session, prompt)
      if (result.finishReason === 'cancelled') {
        code = EXIT.cancelled
        return false
      }
      if (result.finishReason === 'failed' && !interactive) code = EXIT.error
      return true
    } catch (error) {
      if (!interactive) throw error
      ctx.out.error(error, ctx.apiUrl)
      return true
    }
  }
  try {
    if (options.prompt !== undefined) {
      const more = await send(options.prompt)
      if (!more || options.single || !interactive) return code
    }
    if (!onTerminal) {
      const lines = createInterface({
        input: process.stdin,
        terminal: false,
        crlfDelay: Number.POSITIVE_INFINITY,
      })
      try {
        for await (const line of lines) {
          const text = line.trim()
          if (text === '') continue
          if (LEAVE.has(text.toLowerCase())) break
          if (!(await send(line))) break
        }
      } finally {
        lines.close()
      }
      return code
    }
    const history: string[] = []
    while (true) {
      const answer = await askLine(ctx.out.ec.bold(ctx.out.ec.green('You> ')), history)
      if (answer.kind === 'interrupt') {
        code = EXIT.cancelled
        break
      }
      if (answer.kind === 'eof') {
        process.stderr.write('\n')
        break
      }
      const text = answer.text.trim()
      if (text === '' || LEAVE.has(text.toLowerCase())) break
      if (!(await send(answer.text))) break
    }
    return code
  } finally {
    ctx.out.note(ctx.out.ec.dim(`Resume with: cairn sessions resume ${shortId(session.id)}`))
  }
}

/** Turns a chat exit code into the error the top level expects (so 130 prints nothing more). */
export function exitFromChat(code: number): void {
  if (code === EXIT.cancelled) throw new CancelledError('')
  if (code !== EXIT.ok) throw new CliError('', { exitCode: code })
}
