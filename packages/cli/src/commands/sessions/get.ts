import type { SetupInfo } from '@cairn/protocol'
import { ID_PREFIXES, isId } from '@cairn/protocol/core'
import { NotFoundError, type Session } from '@cairn/sdk'
import { jsonOption, type Register } from '../../command.js'
import type { Context } from '../../context.js'
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

/**
 * The session a full ID names, whatever its status (a deleted one too: `sessions list --status
 * deleted` shows it, and its record is kept); anything shorter is a prefix, resolved among the
 * sessions not deleted, as every session argument is.
 */
async function sessionById(ctx: Context, arg: string): Promise<Session> {
  const trimmed = arg.trim()
  const full = trimmed.startsWith(ID_PREFIXES.session) ? trimmed : `${ID_PREFIXES.session}${trimmed}`
  if (!isId('session', full)) return resolveSession(ctx, trimmed)
  try {
    return await (await ctx.client()).sessions.get(full)
  } catch (error) {
    // None with that ID: the answer every session argument gives ("No session found matching …").
    if (error instanceof NotFoundError) return resolveSession(ctx, trimmed)
    throw error
  }
}

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('get')
      .description('Show a session (and its setup phase, with the log tail, when it has one)')
      .argument('<id>', 'session ID (a deleted session too) or a unique prefix of it'),
  ).action(async (id: string) => {
    const session = await sessionById(ctx, id)
    const setup = await setupOf(session)
    if (ctx.json) return ctx.out.data(setup ? { ...session.info, setup } : session.info)
    const fields = sessionFields(session.info, new Date())
    if (setup) {
      const exit = setup.exitCode === null ? '' : `, exit ${setup.exitCode}`
      fields.push(['Setup', `${setup.status} (attempt ${setup.attempts}${exit})`])
      fields.push(['Setup command', stripTerminalEscapes(setup.command.join(' '))])
    }
    ctx.out.line(renderFields(fields, ctx.out.c.bold))
    if (session.info.status === 'deleted')
      ctx.out.note(
        'This session is deleted: its workspace is gone and it cannot be resumed; its record is kept.',
      )
    if (setup?.logTail) {
      ctx.out.line()
      ctx.out.line(ctx.out.c.bold('Setup log (last lines):'))
      ctx.out.line(stripTerminalEscapes(setup.logTail))
    }
  })
}
