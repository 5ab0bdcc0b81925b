import { jsonOption, type Register } from '../../command.js'
import { oneLine } from '../../format/sanitize.js'
import { renderTable } from '../../format/table.js'
import { formatBytes, relativeTime } from '../../format/time.js'
import { resolveSession } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  const snapshots = parent.command('snapshots')
  jsonOption(
    snapshots
      .command('rm')
      .alias('delete')
      .description(
        'Delete a snapshot, freeing what it alone holds (refused while a restore, fork or export reads it)',
      )
      .argument('<session>', 'session ID or a unique prefix of it')
      .argument('<snapshot>', 'snapshot ID (see `cairn sessions snapshots <session>`)'),
  ).action(async (id: string, snapshotId: string) => {
    const session = await resolveSession(ctx, id)
    await session.snapshots.delete(snapshotId)
    if (ctx.json) return ctx.out.data({ ok: true, id: snapshotId })
    ctx.out.line(`Deleted snapshot ${snapshotId}`)
  })
  jsonOption(
    snapshots
      .description("List a session's snapshots (automatic ones before each turn, and manual ones)")
      .argument('<id>', 'session ID or a unique prefix of it')
      .option('--digest', 'show each content digest (computed once, on first request: reads every file)')
      .option(
        '--sizes',
        'show referenced and exclusive bytes (exclusive: freed by deleting that snapshot alone; measured on each request)',
      ),
  ).action(async (id: string, options: { digest?: boolean; sizes?: boolean }) => {
    const session = await resolveSession(ctx, id)
    const snapshots = await session.snapshots.list({
      digest: options.digest === true,
      sizes: options.sizes === true,
    })
    if (ctx.json) return ctx.out.data(snapshots)
    if (snapshots.length === 0) {
      ctx.out.note('No snapshots yet.')
      return
    }
    const now = new Date()
    const rows = snapshots.map((s) => [
      s.id,
      s.throughTurn > s.turn ? `${s.turn}–${s.throughTurn}` : String(s.turn),
      s.kind,
      oneLine(s.reason),
      oneLine(s.label ?? '', 40),
      relativeTime(s.createdAt, now),
      ...(options.sizes
        ? [
            s.sizes ? formatBytes(s.sizes.referencedBytes) : '',
            s.sizes ? formatBytes(s.sizes.exclusiveBytes) : '',
          ]
        : []),
      ...(options.digest ? [s.digest ?? ''] : []),
    ])
    const headers = [
      'ID',
      'After Turn',
      'Kind',
      'Reason',
      'Label',
      'Created',
      ...(options.sizes ? ['Referenced', 'Exclusive'] : []),
      ...(options.digest ? ['Digest'] : []),
    ]
    ctx.out.line(renderTable(headers, rows, ctx.out.c.bold))
  })
}
