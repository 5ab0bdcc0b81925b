import { CairnProblem } from '@cairn/protocol'
import type { FastifyInstance } from 'fastify'
import { principalOf } from '../auth/plugin.js'
import { errorBody } from '../http/errors.js'
import type { McpDeps, McpTools } from './mcp-server.js'
import { MCP_PATH } from './path.js'

/**
 * The MCP SDK (with Zod, ~1,000 modules' worth of start-up: ~0.3 s of CPU on a loaded 2-core
 * machine) and the tools' compiled validators, loaded by the first MCP request rather than by
 * every server start: most installs, and most test servers, never get one.
 */
async function loadMcp() {
  const [{ McpTools, mcpServer }, { StreamableHTTPServerTransport }] = await Promise.all([
    import('./mcp-server.js'),
    import('@modelcontextprotocol/sdk/server/streamableHttp.js'),
  ])
  return { tools: new McpTools() as McpTools, mcpServer, StreamableHTTPServerTransport }
}

/**
 * The MCP server over Streamable HTTP, stateless: each POST is answered by a server and transport
 * of its own, for the key that sent it, so any API replica answers any request and nothing is held
 * between them (the Cairn session is the state). Only POST is served: with no MCP session there is
 * no stream to GET or session to DELETE, and both answer 405 (the SDK's client expects that). Not
 * in the OpenAPI document: its contract is MCP's (JSON-RPC; `tools/list` gives each tool's schema).
 */
export function mcpRoutes(app: FastifyInstance, deps: McpDeps): void {
  let mcp: ReturnType<typeof loadMcp> | undefined
  app.post(MCP_PATH, { schema: { hide: true } }, async (request, reply) => {
    const principal = principalOf(request)
    // One message per request: a JSON-RPC batch (MCP 2025-03-26 allowed them, 2025-06-18 dropped
    // them) would carry any number of tool calls past the per-key and per-tenant rate limits,
    // which count requests.
    if (Array.isArray(request.body))
      throw new CairnProblem(
        'validation_failed',
        'JSON-RPC batches are not served: send one message per request',
      )
    mcp ??= loadMcp()
    const { tools, mcpServer, StreamableHTTPServerTransport } = await mcp
    // No sessionIdGenerator: the transport's stateless mode.
    const server = mcpServer(deps, tools, { principal, requestId: request.id })
    const transport = new StreamableHTTPServerTransport({})
    reply.hijack()
    // The response's end, or its client leaving: the server's handlers see their signal abort.
    reply.raw.once('close', () => {
      void server.close().catch(() => undefined)
    })
    try {
      await server.connect(transport)
      await transport.handleRequest(request.raw, reply.raw, request.body)
    } catch (error) {
      // The transport answers what it refuses itself; this is a failure of ours, after the hijack.
      request.log.error({ err: error }, 'MCP request failed')
      if (!reply.raw.headersSent)
        reply.raw
          .writeHead(500, { 'content-type': 'application/json' })
          .end(JSON.stringify(errorBody('internal', 'internal error', request.id)))
      else reply.raw.destroy()
    }
  })
}
