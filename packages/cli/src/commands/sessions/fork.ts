import type { Session } from '@cairn/sdk'
import { jsonOption, positiveInt, positiveIntOrZero, type Register } from '../../command.js'
import type { Context } from '../../context.js'
import { UsageError } from '../../errors.js'
import { shortId } from '../../format/ids.js'
import { resolveSession, resolveSnapshot } from '../../session-arg.js'

interface ForkOptions {
  turn?: number
  title?: string
  memory?: boolean
  count?: number
}

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('fork')
      .description(
        'Start a new session from a snapshot, with the transcript up to its turn; --memory: from its running processes now',
      )
      .argument('<id>', 'session ID or a unique prefix of it')
      .argument('[snapshot]', 'snapshot ID or a unique prefix of it (default: the latest)')
      .option('--turn <n>', 'fork from the snapshot taken after turn n', positiveIntOrZero)
      .option('--title <title>', 'title of the new session')
      .option(
        '--memory',
        'fork the session as it is now with its running processes and memory (a pause: memory session under gVisor)',
      )
      .option('--count <n>', 'how many forks of the session as it is now (default 1)', positiveInt),
  ).action(async (id: string, snapshotArg: string | undefined, options: ForkOptions) => {
    if (snapshotArg !== undefined && options.turn !== undefined)
      throw new UsageError('Name a snapshot or pass --turn, not both')
    const session = await resolveSession(ctx, id)
    if (options.memory || options.count !== undefined) return forkNow(ctx, session, snapshotArg, options)
    const snapshotId = snapshotArg === undefined ? undefined : await resolveSnapshot(session, snapshotArg)
    const fork = await session.snapshots.fork({ snapshotId, turn: options.turn, title: options.title })
    if (ctx.json) return ctx.out.data(fork)
    ctx.out.line(`Forked ${shortId(session.id)} into ${fork.id}`)
    ctx.out.progress(`Continue it with: cairn sessions resume ${shortId(fork.id)}`)
  })
}

/** `--memory` / `--count`: forks of the session as it is now, from one snapshot taken for them. */
async function forkNow(
  ctx: Context,
  session: Session,
  snapshotArg: string | undefined,
  options: ForkOptions,
): Promise<void> {
  if (snapshotArg !== undefined || options.turn !== undefined)
    throw new UsageError(
      '--memory and --count fork the session as it is now: leave out the snapshot and --turn',
    )
  const result = await session.snapshots.forks({
    memory: options.memory === true,
    count: options.count,
    title: options.title,
  })
  if (ctx.json) return ctx.out.data(result)
  const what = result.memory ? ' with its memory' : ''
  for (const fork of result.sessions)
    ctx.out.line(`Forked ${shortId(session.id)}${what} into ${fork.id} (snapshot ${result.snapshot.id})`)
  ctx.out.progress(`Continue one with: cairn sessions resume ${shortId(result.sessions[0]?.id ?? '')}`)
}
