import { duration, jsonOption, type Register } from '../../command.js'
import { shortId } from '../../format/ids.js'
import { formatDuration } from '../../format/time.js'
import { resolveSession } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('lease')
      .description(
        'Hold a session active for a while: no idle timeout, and a warm sandbox stays warm (again to extend)',
      )
      .argument('<id>', 'session ID or a unique prefix of it')
      .argument('<duration>', 'how long from now, with its unit: 90s, 5m, 1h (1s to 24h)', duration),
  ).action(async (id: string, ttlMs: number) => {
    const session = await resolveSession(ctx, id)
    const lease = await session.lease(ttlMs)
    if (ctx.json) return ctx.out.data(lease)
    ctx.out.line(`Leased ${shortId(session.id)} for ${formatDuration(ttlMs)} (until ${lease.leaseUntil})`)
  })
}
