import { jsonOption, type Register } from '../../command.js'
import { shortId } from '../../format/ids.js'
import { resolveSession } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('undo')
      .description('Put the workspace back as it was before the last turn')
      .argument('<id>', 'session ID or a unique prefix of it'),
  ).action(async (id: string) => {
    const session = await resolveSession(ctx, id)
    const result = await session.snapshots.undo()
    if (ctx.json) return ctx.out.data(result)
    ctx.out.line(
      `Restored ${shortId(session.id)} to ${result.snapshot.id} (after turn ${result.snapshot.turn})`,
    )
  })
}
