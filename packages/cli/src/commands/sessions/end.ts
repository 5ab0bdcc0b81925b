import { jsonOption, type Register } from '../../command.js'
import { shortId } from '../../format/ids.js'
import { resolveSession } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('end')
      .description('End a session (its workspace and transcript are kept; it can be resumed)')
      .argument('<id>', 'session ID or a unique prefix of it'),
  ).action(async (id: string) => {
    const session = await resolveSession(ctx, id)
    await session.end()
    if (ctx.json) return ctx.out.data(session.info)
    const short = shortId(session.id)
    ctx.out.line(`Session ${short} ended (status: ${session.status}). Workspace is preserved.`)
    ctx.out.note(
      `Resume it with \`cairn sessions resume ${short}\`, or delete it with \`cairn sessions delete ${short}\`.`,
    )
  })
}
