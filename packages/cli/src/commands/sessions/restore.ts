import type { SnapshotRef } from '@cairn/sdk'
import { jsonOption, positiveIntOrZero, type Register } from '../../command.js'
import { UsageError } from '../../errors.js'
import { shortId } from '../../format/ids.js'
import { resolveSession, resolveSnapshot } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('restore')
      .description('Replace the workspace with a snapshot: an exact replica, no leftovers')
      .argument('<id>', 'session ID or a unique prefix of it')
      .argument('[snapshot]', 'snapshot ID or a unique prefix of it')
      .option(
        '--turn <n>',
        'the snapshot taken before turn n+1 (0: the workspace as deployed)',
        positiveIntOrZero,
      ),
  ).action(async (id: string, snapshotArg: string | undefined, options: { turn?: number }) => {
    if ((snapshotArg === undefined) === (options.turn === undefined)) {
      throw new UsageError(
        'Name a snapshot or pass --turn, not both',
        'See them with `cairn sessions snapshots <id>`.',
      )
    }
    const session = await resolveSession(ctx, id)
    const ref: SnapshotRef =
      snapshotArg === undefined
        ? { turn: options.turn as number }
        : { snapshotId: await resolveSnapshot(session, snapshotArg) }
    const result = await session.snapshots.restore(ref)
    if (ctx.json) return ctx.out.data(result)
    ctx.out.line(
      `Restored ${shortId(session.id)} to ${result.snapshot.id} (after turn ${result.snapshot.turn})`,
    )
  })
}
