import { jsonOption, type Register } from '../../command.js'
import { shortId } from '../../format/ids.js'
import { resolveSession } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('move')
      .description(
        'Move a session to another node of the cluster (install admin key): its workspace is copied while the session is held (a message meanwhile gets session_moving, retryable), then its owner changes',
      )
      .argument('<id>', 'session ID or a unique prefix of it')
      .option(
        '--to <node>',
        "the node to move it to (its ID, see `cairn nodes list`); default: placement's pick",
      ),
  ).action(async (id: string, options: { to?: string }) => {
    const session = await resolveSession(ctx, id)
    const client = await ctx.client()
    const moved = await client.nodes.moveSession(
      session.id,
      options.to === undefined ? {} : { toNode: options.to },
    )
    if (ctx.json) return ctx.out.data(moved)
    ctx.out.line(
      `Session ${shortId(moved.sessionId)} moved: ${moved.fromNode} → ${moved.toNode} (via ${moved.via}, owner epoch ${moved.ownerEpoch}, ${moved.durationMs} ms)`,
    )
  })
}
