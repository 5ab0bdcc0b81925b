import type { WebhookDeliveryStatus } from '@cairn/sdk'
import { InvalidArgumentError } from 'commander'
import { jsonOption, positiveInt, type Register } from '../../command.js'
import { oneLine } from '../../format/sanitize.js'
import { renderTable } from '../../format/table.js'
import { relativeTime } from '../../format/time.js'

const STATUSES = ['pending', 'delivered', 'failed'] as const

function status(value: string): WebhookDeliveryStatus {
  if (!(STATUSES as readonly string[]).includes(value))
    throw new InvalidArgumentError(`expected ${STATUSES.join(', ')}`)
  return value as WebhookDeliveryStatus
}

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('deliveries')
      .description("A webhook endpoint's delivery log, newest first (each attempt with its answer)")
      .argument('<id>', 'webhook ID (whk_…)')
      .option('--status <status>', 'only pending, delivered or failed ones', status)
      .option('--limit <n>', 'at most this many (1-100, default 50)', positiveInt),
  ).action(async (id: string, options: { status?: WebhookDeliveryStatus; limit?: number }) => {
    const list = await (await ctx.client()).webhooks.deliveries(id, options)
    if (ctx.json) return ctx.out.data(list)
    if (list.length === 0) {
      ctx.out.note('No deliveries yet.')
      return
    }
    const now = new Date()
    const rows = list.map((d) => {
      const last = d.attempts.at(-1)
      const answer = last ? (last.statusCode ?? oneLine(last.error ?? '-', 50)) : '-'
      return [
        d.id,
        d.eventType,
        d.status,
        String(d.attempts.length),
        String(answer),
        relativeTime(d.createdAt, now),
      ]
    })
    ctx.out.line(
      renderTable(['ID', 'Event', 'Status', 'Attempts', 'Last answer', 'Created'], rows, ctx.out.c.bold),
    )
  })
}
