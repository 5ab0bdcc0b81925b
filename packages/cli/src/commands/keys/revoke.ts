import type { ApiKeyInfo, Keys } from '@cairn/sdk'
import { jsonOption, type Register } from '../../command.js'
import { CliError } from '../../errors.js'
import { oneLine } from '../../format/sanitize.js'
import { confirmDestructive } from '../../prompt.js'

/** A key by its ID or a unique prefix of it (with or without `key_`); an exact ID wins, even revoked. */
async function resolveKey(keys: Keys, prefix: string): Promise<ApiKeyInfo> {
  const wanted = prefix.startsWith('key_') ? prefix : `key_${prefix}`
  const all = await keys.list()
  const exact = all.find((k) => k.id === wanted)
  if (exact) return exact
  const matches = all.filter((k) => k.id.startsWith(wanted) && k.revokedAt === null)
  if (matches.length === 1) return matches[0] as ApiKeyInfo
  if (matches.length === 0) {
    throw new CliError(`No active API key matching '${prefix}'`, {
      code: 'not_found',
      hint: 'List them with `cairn keys list`.',
    })
  }
  throw new CliError(`Ambiguous key ID '${prefix}' — matches: ${matches.map((k) => k.id).join(', ')}`, {
    code: 'ambiguous_id',
    hint: 'Type more characters of the ID.',
  })
}

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('revoke')
      .alias('rm')
      .description('Revoke an API key (requests with it are refused at once; this cannot be undone)')
      .argument('<id>', 'key ID or a unique prefix of it')
      .option('-y, --yes', 'do not ask for confirmation (needed without a terminal)'),
  ).action(async (id: string, options: { yes?: boolean }) => {
    const client = await ctx.client()
    const key = await resolveKey(client.keys, id.trim())
    const label = `${key.id} (${oneLine(key.name ?? key.prefix, 60)})`
    const current = (await ctx.api()).apiKey?.startsWith(key.prefix) === true
    const question = `Revoke key ${label}${current ? ', the one this CLI is using' : ''}?`
    await confirmDestructive(question, {
      yes: options.yes,
      refused: 'Nothing revoked',
      command: `cairn keys revoke ${id}`,
    })
    await client.keys.revoke(key.id)
    if (ctx.json) return ctx.out.data({ ok: true, id: key.id })
    ctx.out.line(`Revoked key ${label}`)
    if (current) ctx.out.note(ctx.out.ec.yellow('That was the key this CLI uses: log in with another one.'))
  })
}
