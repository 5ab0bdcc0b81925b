import { jsonOption, type Register } from '../command.js'
import { credentialsPath, removeCredentials } from '../credentials.js'

export const register: Register = (parent, ctx) => {
  jsonOption(parent.command('logout').description('Forget the saved API key')).action(async () => {
    const file = credentialsPath(ctx.env)
    const removed = await removeCredentials(file)
    if (ctx.json) return ctx.out.data({ removed, credentialsPath: file })
    ctx.out.line(removed ? `Logged out (removed ${file})` : 'Not logged in')
    if (ctx.env.CAIRN_API_KEY) ctx.out.note('CAIRN_API_KEY is still set in this environment.')
  })
}
