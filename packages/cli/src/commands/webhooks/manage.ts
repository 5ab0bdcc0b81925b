import type { WebhookEventType } from '@cairn/sdk'
import { jsonOption, type Register } from '../../command.js'
import { CliError } from '../../errors.js'
import { confirmDestructive } from '../../prompt.js'
import { eventTypes } from './events.js'

interface UpdateOptions {
  url?: string
  events?: WebhookEventType[]
  description?: string
  enable?: boolean
}

/** `get`, `update` and `delete` of one endpoint, by its full ID. */
export const register: Register = (parent, ctx) => {
  jsonOption(
    parent.command('get').description('Show a webhook endpoint').argument('<id>', 'webhook ID (whk_…)'),
  ).action(async (id: string) => {
    const hook = await (await ctx.client()).webhooks.get(id)
    if (ctx.json) return ctx.out.data(hook)
    ctx.out.line(`${hook.id} → ${hook.url}\n  events: ${hook.events.join(', ')}\n  enabled: ${hook.enabled}`)
    if (hook.description) ctx.out.line(`  description: ${hook.description}`)
  })
  jsonOption(
    parent
      .command('update')
      .description("Change a webhook endpoint's URL, events, description, or pause it")
      .argument('<id>', 'webhook ID (whk_…)')
      .option('--url <url>', 'new URL')
      .option('--events <types>', 'comma-separated event types, or all', eventTypes)
      .option('--description <text>', 'new description')
      .option('--enable', 'send to it again')
      .option('--no-enable', 'send nothing new to it (what is pending waits)'),
  ).action(async (id: string, options: UpdateOptions) => {
    const { url, events, description, enable } = options
    if ([url, events, description, enable].every((v) => v === undefined))
      throw new CliError('Nothing to change', {
        code: 'bad_request',
        hint: 'Give --url, --events, --description, --enable or --no-enable.',
      })
    const hook = await (await ctx.client()).webhooks.update(id, { url, events, description, enabled: enable })
    if (ctx.json) return ctx.out.data(hook)
    ctx.out.line(
      `Updated webhook ${hook.id} → ${hook.url} (${hook.events.join(', ')}${hook.enabled ? '' : ', disabled'})`,
    )
  })
  jsonOption(
    parent
      .command('delete')
      .alias('rm')
      .description('Delete a webhook endpoint and its delivery log')
      .argument('<id>', 'webhook ID (whk_…)')
      .option('-y, --yes', 'do not ask for confirmation (needed without a terminal)'),
  ).action(async (id: string, options: { yes?: boolean }) => {
    await confirmDestructive(`Delete webhook ${id} and its delivery log?`, {
      yes: options.yes,
      refused: 'Nothing deleted',
      command: `cairn webhooks delete ${id}`,
    })
    await (await ctx.client()).webhooks.delete(id)
    if (ctx.json) return ctx.out.data({ ok: true, id })
    ctx.out.line(`Deleted webhook ${id}`)
  })
}
