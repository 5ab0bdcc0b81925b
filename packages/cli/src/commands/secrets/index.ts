import type { Register } from '../../command.js'
import { register as del } from './delete.js'
import { register as list } from './list.js'
import { register as set } from './set.js'

export const register: Register = (parent, ctx) => {
  const secrets = parent.command('secrets').alias('secret').description("Manage an agent's secrets")
  for (const r of [set, list, del]) r(secrets, ctx)
}
