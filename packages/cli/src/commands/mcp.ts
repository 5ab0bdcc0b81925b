import type { Register } from '../command.js'
import { CLI_VERSION } from '../context.js'
import { CliError } from '../errors.js'

export const register: Register = (parent, ctx) => {
  parent
    .command('mcp')
    .description(
      "Serve Cairn's MCP tools and resources over stdio, for desktop clients configured with a command: a proxy to the server's /v1/mcp with this CLI's API URL and key (stdout carries the protocol only; ends when stdin closes)",
    )
    .action(async () => {
      const config = await ctx.api()
      if (config.apiKey === undefined)
        throw new CliError('no API key for the MCP server', {
          code: 'unauthorized',
          hint: 'set CAIRN_API_KEY (and CAIRN_API_URL) in the client configuration, or run `cairn login`',
        })
      // Loaded here, from the server package (which holds the MCP SDK): every other command starts without it.
      const { serveMcpOverStdio } = await import('@cairn/server/mcp-stdio')
      await serveMcpOverStdio({
        apiUrl: config.apiUrl,
        apiKey: config.apiKey,
        version: CLI_VERSION,
      }).catch((error: unknown) => {
        // Only the connection to the server fails here (a desktop client shows this stderr).
        const reason = error instanceof Error ? error.message : String(error)
        throw new CliError(`the MCP server at ${config.apiUrl}/v1/mcp did not answer: ${reason}`, {
          hint: 'check CAIRN_API_URL and CAIRN_API_KEY (or the login `cairn login` saved)',
        })
      })
    })
}
