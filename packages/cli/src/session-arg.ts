import type { Session } from '@cairn/sdk'
import type { Context } from './context.js'
import { CliError } from './errors.js'
import { shortId } from './format/ids.js'

/** Every session argument is a unique ID prefix, resolved by the server (its messages are the errors). */
export async function resolveSession(ctx: Context, prefix: string): Promise<Session> {
  const client = await ctx.client()
  return client.sessions.resolve(prefix.trim())
}

/** A snapshot of `session` by its ID or a unique prefix of it (with or without `snap_`). */
export async function resolveSnapshot(session: Session, prefix: string): Promise<string> {
  const wanted = prefix.startsWith('snap_') ? prefix : `snap_${prefix}`
  const snapshots = await session.snapshots.list()
  const matches = snapshots.filter((s) => s.id.startsWith(wanted)).map((s) => s.id)
  if (matches.length === 1) return matches[0] as string
  if (matches.length === 0) {
    throw new CliError(`No snapshot of ${session.id} matching '${prefix}'`, {
      code: 'not_found',
      hint: `List them with \`cairn sessions snapshots ${shortId(session.id)}\`.`,
    })
  }
  throw new CliError(`Ambiguous snapshot '${prefix}' — matches: ${matches.join(', ')}`, {
    code: 'ambiguous_id',
    hint: 'Type more characters of the ID.',
  })
}
