import type { Register } from '../../command.js'
import { register as create } from './create.js'
import { register as deliveries } from './deliveries.js'
import { register as list } from './list.js'
import { register as manage } from './manage.js'

export const register: Register = (parent, ctx) => {
  const webhooks = parent
    .command('webhooks')
    .alias('webhook')
    .description(
      'Register endpoints for lifecycle events (signed per Standard Webhooks) and read their delivery logs',
    )
  for (const r of [list, create, manage, deliveries]) r(webhooks, ctx)
}
