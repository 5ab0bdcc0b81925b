import type { StreamEvent } from '@cairn/protocol'
import type { RunResult, Session } from '@cairn/sdk'
import type { Context } from './context.js'
import { CliError } from './errors.js'
import { connectionLost, turnFailureHint } from './format/errors.js'
import { shortId } from './format/ids.js'
import { oneLine, stripTerminalEscapes } from './format/sanitize.js'
import { formatDuration, formatSeconds } from './format/time.js'
import { inForeground } from './prompt.js'

/** The per-turn record printed with `--json`. */
export function turnRecord(result: RunResult): Record<string, unknown> {
  return {
    sessionId: result.sessionId,
    turn: result.turn ?? null,
    text: result.text,
    finishReason: result.finishReason,
    durationMs: result.durationMs,
    ...(result.error ? { error: result.error } : {}),
  }
}

function summarize(value: unknown): string {
  if (value === undefined) return ''
  return oneLine(typeof value === 'string' ? value : JSON.stringify(value), 80)
}

/**
 * Sends one message and prints the reply as it streams: text on stdout (`Agent>` first on a
 * terminal), tool and status lines dim on stderr, `Completed in 1.2s`. Ctrl-C cancels the turn.
 * With `--json`, prints one record when the turn is over.
 */
export async function runTurn(ctx: Context, session: Session, prompt: string): Promise<RunResult> {
  const { out } = ctx
  // A dropped connection (a server restart, Wi-Fi, a proxy's timeout) is picked up again after
  // the last event received; each try is said on stderr.
  const stream = session.stream(prompt, {
    onReconnect: ({ attempt, maxAttempts, afterEventId, delayMs }) =>
      out.note(
        out.ec.yellow(
          `Connection lost; picking the turn up again after event ${afterEventId} in ${formatSeconds(delayMs)} (try ${attempt} of ${maxAttempts})…`,
        ),
      ),
  })
  let interrupts = 0
  const onSigint = () => {
    // A second Ctrl-C does not wait for the server any more.
    if (++interrupts > 1) process.exit(130)
    out.note(out.ec.yellow('Cancelling… (Ctrl-C again to quit at once)'))
    void stream.abort()
  }
  process.on('SIGINT', onSigint)
  // No spinner from a background job: its frames would land in the middle of the foreground's output.
  const spinner = ctx.json || !inForeground() ? undefined : out.spinner('Waiting for the agent…')
  let begun = false
  let atLineStart = true
  const begin = () => {
    if (begun) return
    begun = true
    spinner?.stop()
    if (out.stdoutIsTty) out.write(out.c.bold(out.c.cyan('Agent> ')))
    atLineStart = !out.stdoutIsTty
  }
  // Tool and status lines go to stderr before the reply starts, or on a line of their own.
  const side = (text: string) => {
    if (!out.stderrIsTty) return
    spinner?.stop()
    if (!atLineStart && out.stdoutIsTty) {
      out.write('\n')
      atLineStart = true
    }
    out.note(out.ec.dim(`  ${text}`))
  }
  const tools = new Map<string, string>()
  try {
    if (!ctx.json) {
      for await (const event of stream as AsyncIterable<StreamEvent>) {
        if (event.type === 'message.delta') {
          const text = stripTerminalEscapes(event.content)
          if (text === '') continue
          begin()
          out.write(text)
          atLineStart = text.endsWith('\n')
        } else if (event.type === 'tool.start') {
          tools.set(event.toolCallId, event.name)
          side(`→ ${oneLine(event.name, 40)} ${summarize(event.input)}`.trimEnd())
        } else if (event.type === 'tool.end') {
          const name = oneLine(tools.get(event.toolCallId) ?? event.toolCallId, 40)
          const took = event.durationMs === undefined ? '' : ` (${formatDuration(event.durationMs)})`
          side(`${event.isError ? '✗' : '←'} ${name}${took} ${summarize(event.output)}`.trimEnd())
        } else if (event.type === 'status') {
          side(`… ${oneLine(event.message, 120)}`)
        }
      }
    }
    const result = await stream.result
    spinner?.stop()
    if (ctx.json) {
      out.record(turnRecord(result))
      return result
    }
    // A reply that arrived only as the final text (no deltas) is printed whole.
    const finalText = stripTerminalEscapes(result.text)
    if (result.finishReason === 'completed' && !begun && finalText !== '') {
      begin()
      out.write(finalText)
      atLineStart = finalText.endsWith('\n')
    }
    if (!atLineStart) out.write('\n')
    if (result.finishReason === 'completed') {
      out.progress(`Completed in ${formatSeconds(result.durationMs)}`)
    } else if (result.finishReason === 'failed') {
      out.error({
        code: result.error?.code,
        message: result.error?.message ?? 'the turn failed',
        hint: turnFailureHint(result.error?.code, shortId(session.id)),
      })
    } else {
      out.note(out.ec.yellow(`Cancelled after ${formatSeconds(result.durationMs)}`))
    }
    return result
  } catch (error) {
    if (!connectionLost(error)) throw error
    const ref = shortId(session.id)
    throw new CliError(
      'The server went away during the turn: the connection closed before the answer ended',
      {
        code: 'connection_error',
        hint: `When it is back (\`cairn server\`), see how the turn ended with \`cairn sessions messages ${ref}\` and go on with \`cairn sessions resume ${ref}\`.`,
      },
    )
  } finally {
    spinner?.stop()
    process.off('SIGINT', onSigint)
  }
}
