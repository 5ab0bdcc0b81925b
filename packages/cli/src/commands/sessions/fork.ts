import { jsonOption, positiveIntOrZero, type Register } from '../../command.js'
import { UsageError } from '../../errors.js'
import { shortId } from '../../format/ids.js'
import { resolveSession, resolveSnapshot } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('fork')
      .description('Start a new session from a snapshot, with the transcript up to its turn')
      .argument('<id>', 'session ID or a unique prefix of it')
      .argument('[snapshot]', 'snapshot ID or a unique prefix of it (default: the latest)')
      .option('--turn <n>', 'fork from the snapshot taken after turn n', positiveIntOrZero)
      .option('--title <title>', 'title of the new session'),
  ).action(
    async (id: string, snapshotArg: string | undefined, options: { turn?: number; title?: string }) => {
      if (snapshotArg !== undefined && options.turn !== undefined)
        throw new UsageError('Name a snapshot or pass --turn, not both')
      const session = await resolveSession(ctx, id)
      const snapshotId = snapshotArg === undefined ? undefined : await resolveSnapshot(session, snapshotArg)
      const fork = await session.snapshots.fork({ snapshotId, turn: options.turn, title: options.title })
      if (ctx.json) return ctx.out.data(fork)
      ctx.out.line(`Forked ${shortId(session.id)} into ${fork.id}`)
      ctx.out.progress(`Continue it with: cairn sessions resume ${shortId(fork.id)}`)
    },
  )
}
