import type { Register } from '../../command.js'
import { register as create } from './create.js'
import { register as list } from './list.js'
import { register as revoke } from './revoke.js'

export const register: Register = (parent, ctx) => {
  const keys = parent
    .command('keys')
    .alias('key')
    .description("Create, list and revoke API keys (of your key's tenant; needs an admin key)")
  for (const r of [list, create, revoke]) r(keys, ctx)
}
