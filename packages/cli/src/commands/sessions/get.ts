import type { SetupInfo } from '@cairn/protocol'
import { NotFoundError, type Session } from '@cairn/sdk'
import { jsonOption, type Register } from '../../command.js'
import { stripTerminalEscapes } from '../../format/sanitize.js'
import { sessionFields } from '../../format/session.js'
import { renderFields } from '../../format/table.js'
import { resolveSession } from '../../session-arg.js'

/** The setup phase, when the session has one (a session without one answers 404). */
async function setupOf(session: Session): Promise<SetupInfo | undefined> {
  try {
    return await session.setup()
  } catch (error) {
    if (error instanceof NotFoundError) return undefined
    throw error
  }
}

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('get')
      .description('Show a session (and its setup phase, with the log tail, when it has one)')
      .argument('<id>', 'session ID or a unique prefix of it'),
  ).action(async (id: string) => {
    const session = await resolveSession(ctx, id)
    const setup = await setupOf(session)
    if (ctx.json) return ctx.out.data(setup ? { ...session.info, setup } : session.info)
    const fields = sessionFields(session.info, new Date())
    if (setup) {
      const exit = setup.exitCode === null ? '' : `, exit ${setup.exitCode}`
      fields.push(['Setup', `${setup.status} (attempt ${setup.attempts}${exit})`])
      fields.push(['Setup command', stripTerminalEscapes(setup.command.join(' '))])
    }
    ctx.out.line(renderFields(fields, ctx.out.c.bold))
    if (setup?.logTail) {
      ctx.out.line()
      ctx.out.line(ctx.out.c.bold('Setup log (last lines):'))
      ctx.out.line(stripTerminalEscapes(setup.logTail))
    }
  })
}
