import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { Server } from '@modelcontextprotocol/sdk/server/index.js'
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js'
import {
  CallToolRequestSchema,
  ListResourcesRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListToolsRequestSchema,
  ReadResourceRequestSchema,
} from '@modelcontextprotocol/sdk/types.js'
import { MCP_PATH } from './path.js'

export interface StdioProxyOptions {
  /** The Cairn server (`CAIRN_API_URL`, or the CLI's saved login). */
  apiUrl: string
  apiKey: string
  /** Named to the server as this client's version. */
  version: string
}

/**
 * The longest a proxied call waits with no word from the server (a progress notification resets
 * it): a turn's whole length is bounded by its own timeout, and the desktop client can cancel any
 * call; this is only the ceiling for a server that went silent.
 */
const SILENT_CALL_MS = 24 * 60 * 60 * 1000

/**
 * `cairn mcp`: the same MCP server over stdio, for desktop clients configured with a command. It is
 * the server's own (`/v1/mcp`), reached with the SDK's client: every request of the desktop client
 * is sent on, with this key, and answered with what the server answered (progress included). It
 * holds no tool of its own, so stdio and HTTP cannot drift. Resolves when stdin closes.
 */
export async function serveMcpOverStdio(options: StdioProxyOptions): Promise<void> {
  const upstream = new Client({ name: 'cairn-mcp-stdio', version: options.version })
  await upstream.connect(
    new StreamableHTTPClientTransport(new URL(MCP_PATH, options.apiUrl), {
      requestInit: { headers: { authorization: `Bearer ${options.apiKey}` } },
    }),
  )
  const info = upstream.getServerVersion() ?? { name: 'cairn', version: options.version }
  const instructions = upstream.getInstructions()
  const server = new Server(info, {
    capabilities: upstream.getServerCapabilities() ?? {},
    ...(instructions === undefined ? {} : { instructions }),
  })
  server.setRequestHandler(ListToolsRequestSchema, (request, extra) =>
    upstream.listTools(request.params, { signal: extra.signal }),
  )
  server.setRequestHandler(CallToolRequestSchema, (request, extra) => {
    const token = request.params._meta?.progressToken
    return upstream.callTool(request.params, undefined, {
      signal: extra.signal,
      timeout: SILENT_CALL_MS,
      resetTimeoutOnProgress: true,
      onprogress: (progress) => {
        if (token === undefined) return
        void extra
          .sendNotification({
            method: 'notifications/progress',
            params: { ...progress, progressToken: token },
          })
          .catch(() => undefined)
      },
    })
  })
  server.setRequestHandler(ListResourcesRequestSchema, (request, extra) =>
    upstream.listResources(request.params, { signal: extra.signal }),
  )
  server.setRequestHandler(ListResourceTemplatesRequestSchema, (request, extra) =>
    upstream.listResourceTemplates(request.params, { signal: extra.signal }),
  )
  server.setRequestHandler(ReadResourceRequestSchema, (request, extra) =>
    upstream.readResource(request.params, { signal: extra.signal }),
  )
  const closed = new Promise<void>((resolve) => {
    server.onclose = () => resolve()
  })
  // The transport does not stop at the end of its input; the client closing stdin is its goodbye.
  process.stdin.once('end', () => void server.close())
  await server.connect(new StdioServerTransport())
  await closed
  await upstream.close()
}
