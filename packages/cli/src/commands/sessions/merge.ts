import type { MergeResult } from '@cairn/sdk'
import { jsonOption, type Register } from '../../command.js'
import { UsageError } from '../../errors.js'
import { shortId } from '../../format/ids.js'
import { resolveSession, resolveSnapshot } from '../../session-arg.js'

interface MergeOptions {
  into?: string
  snapshot?: string
  preview?: boolean
  markers?: boolean
}

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('merge')
      .description("Merge a fork's changes since its fork point into its parent (three-way, text by line)")
      .argument('<fork>', 'the fork: session ID or a unique prefix of it')
      .option('--into <target>', 'merge into this session of the same agent (default: the parent)')
      .option('--snapshot <snapshot>', 'merge this snapshot of the fork instead of its workspace')
      .option('--preview', 'say what would change; change nothing')
      .option('--markers', 'write text files both sides changed on the same lines with conflict markers'),
  ).action(async (forkArg: string, options: MergeOptions) => {
    const fork = await resolveSession(ctx, forkArg)
    const into = options.into === undefined ? undefined : (await resolveSession(ctx, options.into)).id
    if (into === fork.id) throw new UsageError('A session cannot be merged into itself')
    const snapshotId =
      options.snapshot === undefined ? undefined : await resolveSnapshot(fork, options.snapshot)
    const result = await fork.snapshots.merge({
      into,
      snapshotId,
      preview: options.preview === true,
      strategy: options.markers ? 'markers' : 'keep',
    })
    if (ctx.json) return ctx.out.data(result)
    printMerge(ctx.out, result)
  })
}

function printMerge(
  out: { line(text: string): void; progress(text: string): void },
  result: MergeResult,
): void {
  const target = shortId(result.into.id)
  const verb = result.preview ? 'Would merge' : 'Merged'
  out.line(
    `${verb} ${shortId(result.fork.sessionId)} into ${target}: ${result.changes.length} change(s), ${result.conflicts.length} conflict(s)`,
  )
  for (const change of result.changes)
    out.line(`  ${change.action.padEnd(6)} ${change.path}${change.how === 'taken' ? '' : ` (${change.how})`}`)
  for (const conflict of result.conflicts)
    out.line(
      `  CONFLICT (${conflict.kind}${conflict.resolution === 'markers' ? ', markers written' : ''}) ${conflict.path}: ${conflict.reason}`,
    )
  if (result.snapshot) out.progress(`Undo it with: cairn sessions restore ${target} ${result.snapshot.id}`)
}
