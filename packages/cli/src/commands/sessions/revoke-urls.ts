import { jsonOption, type Register } from '../../command.js'
import { shortId } from '../../format/ids.js'
import { resolveSession } from '../../session-arg.js'
import { port } from './open.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('revoke-urls')
      .description('Revoke every signed URL issued so far for a port of the session (later ones work)')
      .argument('<id>', 'session ID or a unique prefix of it')
      .argument('<port>', 'the TCP port the URLs lead to', port),
  ).action(async (id: string, portNumber: number) => {
    const session = await resolveSession(ctx, id)
    await session.revokePreviewUrls(portNumber)
    if (ctx.json) return ctx.out.data({ ok: true })
    ctx.out.line(`Revoked the preview URLs of port ${portNumber} of session ${shortId(session.id)}`)
  })
}
