import type { StatusEvent } from '@cairn/protocol'
import { NotFoundError } from '@cairn/sdk'
import { jsonOption, positiveInt, type Register } from '../../command.js'
import { CancelledError } from '../../errors.js'
import { shortId } from '../../format/ids.js'
import { statusEventLine } from '../../format/session.js'
import { resolveSession } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('watch')
      .description("Follow a session's status changes (with their causes) until it is deleted or Ctrl-C")
      .argument('<id>', 'session ID or a unique prefix of it')
      .option('--interval <ms>', 'how often to poll', positiveInt, 1000),
  ).action(async (id: string, options: { interval: number }) => {
    const session = await resolveSession(ctx, id)
    const seen = new Set<string>()
    const controller = new AbortController()
    const stop = () => controller.abort()
    process.once('SIGINT', stop)
    process.once('SIGTERM', stop)
    const print = (event: StatusEvent) => {
      if (ctx.json) ctx.out.record(event)
      else ctx.out.line(statusEventLine(event))
    }
    ctx.out.progress(`Watching ${shortId(session.id)}; Ctrl-C to stop`)
    try {
      while (!controller.signal.aborted) {
        let events: StatusEvent[]
        try {
          events = await session.events({ signal: controller.signal })
        } catch (error) {
          if (controller.signal.aborted) break
          if (error instanceof NotFoundError) return
          throw error
        }
        for (const event of events) {
          if (seen.has(event.id)) continue
          seen.add(event.id)
          print(event)
        }
        if (events.at(-1)?.to === 'deleted') return
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, options.interval)
          controller.signal.addEventListener('abort', () => {
            clearTimeout(timer)
            resolve()
          })
        })
      }
      throw new CancelledError('')
    } finally {
      process.off('SIGINT', stop)
      process.off('SIGTERM', stop)
    }
  })
}
