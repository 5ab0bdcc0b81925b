import { WEBHOOK_EVENT_TYPES, type WebhookEventType } from '@cairn/protocol/core'
import { InvalidArgumentError } from 'commander'

/** `--events a,b` (or `all`): event types, each one Cairn sends. */
export function eventTypes(value: string): WebhookEventType[] {
  if (value.trim() === 'all') return [...WEBHOOK_EVENT_TYPES]
  const wanted = value
    .split(',')
    .map((v) => v.trim())
    .filter(Boolean)
  const unknown = wanted.filter((v) => !(WEBHOOK_EVENT_TYPES as readonly string[]).includes(v))
  if (wanted.length === 0 || unknown.length > 0)
    throw new InvalidArgumentError(
      `${unknown.length > 0 ? `unknown event ${unknown.join(', ')}; ` : ''}expected all or some of ${WEBHOOK_EVENT_TYPES.join(', ')}`,
    )
  return wanted as WebhookEventType[]
}
