import { jsonOption, type Register } from '../../command.js'
import { shortId } from '../../format/ids.js'
import { oneLine } from '../../format/sanitize.js'
import { confirmDestructive } from '../../prompt.js'
import { resolveSession } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('delete')
      .alias('rm')
      .description('Delete a session with its workspace and transcript')
      .argument('<id>', 'session ID or a unique prefix of it')
      .option('-y, --yes', 'do not ask for confirmation (needed without a terminal)'),
  ).action(async (id: string, options: { yes?: boolean }) => {
    const session = await resolveSession(ctx, id)
    const label = `${shortId(session.id)} ("${oneLine(session.title ?? 'untitled', 60)}")`
    await confirmDestructive(`Delete session ${label} and its workspace?`, {
      yes: options.yes,
      refused: 'Nothing deleted',
      command: `cairn sessions delete ${id}`,
    })
    await session.delete()
    if (ctx.json) return ctx.out.data({ ok: true, id: session.id })
    ctx.out.line(`Deleted session ${label}`)
  })
}
