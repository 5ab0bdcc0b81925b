import type { ApiKeyRole } from '@cairn/sdk'
import { InvalidArgumentError } from 'commander'
import { jsonOption, type Register } from '../../command.js'

const ROLES = ['admin', 'read'] as const

function role(value: string): ApiKeyRole {
  if (!(ROLES as readonly string[]).includes(value))
    throw new InvalidArgumentError(`expected ${ROLES.join(', ')}`)
  return value as ApiKeyRole
}

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('create')
      .description('Create an API key and print it (only this once)')
      .option('--role <role>', 'what it may do: admin (everything; the default) or read (no changes)', role)
      .option('--name <name>', 'a name to recognise it by in `cairn keys list`')
      .option('--tenant <tenant>', "another tenant's name or ID (created on first use; install admin only)"),
  ).action(async (options: { role?: ApiKeyRole; name?: string; tenant?: string }) => {
    const client = await ctx.client()
    const created = await client.keys.create({
      role: options.role,
      name: options.name,
      tenant: options.tenant,
    })
    if (ctx.json) return ctx.out.data(created)
    ctx.out.note(`Created ${created.role} key ${created.id} for tenant ${created.tenantId}`)
    ctx.out.line(created.key)
    ctx.out.note(ctx.out.ec.yellow('Save this key now: it is not shown again.'))
  })
}
