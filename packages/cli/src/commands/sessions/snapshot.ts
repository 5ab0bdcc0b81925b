import { jsonOption, type Register } from '../../command.js'
import { resolveSession } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('snapshot')
      .description("Take a snapshot of a session's workspace (the sandbox is frozen for it; O(1))")
      .argument('<id>', 'session ID or a unique prefix of it')
      .option('--label <label>', 'a name for it'),
  ).action(async (id: string, options: { label?: string }) => {
    const session = await resolveSession(ctx, id)
    const snapshot = await session.snapshots.create({ label: options.label })
    if (ctx.json) return ctx.out.data(snapshot)
    ctx.out.line(`Snapshot ${snapshot.id} (after turn ${snapshot.turn})`)
  })
}
