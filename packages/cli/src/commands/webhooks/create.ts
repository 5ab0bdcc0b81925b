import type { WebhookEventType } from '@cairn/sdk'
import { jsonOption, type Register } from '../../command.js'
import { eventTypes } from './events.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('create')
      .description('Register a webhook endpoint and print its signing secret (only this once)')
      .argument('<url>', 'http:// or https:// URL the events are POSTed to')
      .requiredOption('--events <types>', 'comma-separated event types, or all', eventTypes)
      .option('--description <text>', 'what it is for'),
  ).action(async (url: string, options: { events: WebhookEventType[]; description?: string }) => {
    const created = await (await ctx.client()).webhooks.create(url, options.events, {
      description: options.description,
    })
    if (ctx.json) return ctx.out.data(created)
    ctx.out.note(`Created webhook ${created.id} → ${created.url} (${created.events.join(', ')})`)
    ctx.out.line(created.secret)
    ctx.out.note(ctx.out.ec.yellow('Save this signing secret now: it is not shown again.'))
  })
}
