import type { Register } from '../../command.js'
import { register as del } from './delete.js'
import { register as get } from './get.js'
import { register as list } from './list.js'
import { register as logs } from './logs.js'

export const register: Register = (parent, ctx) => {
  const agents = parent.command('agents').alias('agent').description('List, inspect and delete agents')
  for (const r of [list, get, logs, del]) r(agents, ctx)
}
