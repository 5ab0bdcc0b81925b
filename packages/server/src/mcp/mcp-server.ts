// The SDK's low-level server: its high-level McpServer takes Zod schemas only, and a tool's
// schema here is the protocol's TypeBox schema (JSON Schema as it is) that the route validates by.
import { Server } from '@modelcontextprotocol/sdk/server/index.js'
import {
  CallToolRequestSchema,
  type CallToolResult,
  ListResourcesRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListToolsRequestSchema,
  McpError,
  ReadResourceRequestSchema,
  ErrorCode as RpcErrorCode,
  type Tool,
} from '@modelcontextprotocol/sdk/types.js'
import type { FastifyBaseLogger } from 'fastify'
import type { Principal } from '../auth/api-keys.js'
import { writer } from '../auth/plugin.js'
import { toErrorBody, type ValidationIssue, validationProblem } from '../http/errors.js'
import { typedValidator, type Validate } from '../http/validators.js'
import { listResources, RESOURCE_TEMPLATES, readResource } from './resources.js'
import type { McpServices, ToolCall } from './tool-call.js'
import { MCP_TOOLS, type McpTool } from './tools.js'

export interface McpDeps extends McpServices {
  version: string
  logger: FastifyBaseLogger
}

/** What a request is answered for: the key's tenant and role, and the request's ID (in error bodies). */
export interface McpCaller {
  principal: Principal
  requestId: string
}

/** JSON-RPC's code for a resource that does not exist (the MCP specification's). */
const RESOURCE_NOT_FOUND = -32002

const INSTRUCTIONS =
  'Cairn runs agents in persistent, isolated sessions. list_agents, then create_session (or list_sessions and ' +
  'resume_session), then send_message as often as needed: the workspace (/workspace) persists across turns. ' +
  'Read and change it with list_files, read_file, write_file and diff; snapshot, restore and fork it. Errors ' +
  'are tool results whose text is an error body with a stable code.'

interface CompiledTool {
  tool: McpTool
  validate: Validate
  listed: Tool
}

/** The tools with their validators, compiled once (a server is built per request, the tools are not). */
export class McpTools {
  private readonly byName = new Map<string, CompiledTool>()

  constructor(tools: readonly McpTool[] = MCP_TOOLS) {
    for (const tool of tools) {
      const listed: Tool = {
        name: tool.name,
        description: tool.description,
        inputSchema: tool.input as Tool['inputSchema'],
        annotations: { readOnlyHint: !tool.writes, openWorldHint: false },
      }
      this.byName.set(tool.name, { tool, validate: typedValidator(tool.input), listed })
    }
  }

  /** The tools a key may call: a read-only key is not offered the ones that change anything. */
  list(principal: Principal): Tool[] {
    return [...this.byName.values()]
      .filter((t) => !t.tool.writes || principal.role !== 'read')
      .map((t) => t.listed)
  }

  /**
   * Calls a tool: the key's role checked as the route checks it, the arguments validated as the
   * route's body is, then the service call. Every refusal is a tool error whose text is the error
   * body the route would answer (its registry code), so a model can read it and try again.
   */
  async call(
    deps: McpDeps,
    caller: McpCaller,
    name: string,
    args: Record<string, unknown> | undefined,
    call: ToolCall,
  ): Promise<CallToolResult> {
    const compiled = this.byName.get(name)
    if (!compiled)
      throw new McpError(
        RpcErrorCode.InvalidParams,
        `unknown tool '${name}'; tools: ${[...this.byName.keys()].join(', ')}`,
      )
    try {
      if (compiled.tool.writes) writer(caller.principal)
      const input = args ?? {}
      if (!compiled.validate(input))
        throw validationProblem(
          (compiled.validate.errors ?? []) as ValidationIssue[],
          'arguments',
          `invalid arguments for ${name}`,
        )
      const answer = await compiled.tool.run(deps, call, input)
      return {
        content: [{ type: 'text', text: answer.text ?? JSON.stringify(answer.structured) }],
        structuredContent: answer.structured,
      }
    } catch (error) {
      const { status, body } = toErrorBody(error, caller.requestId)
      if (status >= 500) deps.logger.error({ err: error, tool: name }, 'MCP tool failed')
      return {
        isError: true,
        content: [{ type: 'text', text: JSON.stringify(body) }],
        structuredContent: body as unknown as Record<string, unknown>,
      }
    }
  }
}

/** An MCP server for one HTTP request (stateless: nothing of it outlives the request). */
export function mcpServer(deps: McpDeps, tools: McpTools, caller: McpCaller): Server {
  const server = new Server(
    { name: 'cairn', version: deps.version },
    { capabilities: { tools: {}, resources: {} }, instructions: INSTRUCTIONS },
  )
  const { tenantId } = caller.principal
  server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: tools.list(caller.principal) }))
  server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
    const token = request.params._meta?.progressToken
    let progress = 0
    const call: ToolCall = {
      tenantId,
      signal: extra.signal,
      progress: (message) =>
        token === undefined
          ? undefined
          : extra.sendNotification({
              method: 'notifications/progress',
              params: { progressToken: token, progress: ++progress, message },
            }),
    }
    return tools.call(deps, caller, request.params.name, request.params.arguments, call)
  })
  server.setRequestHandler(ListResourceTemplatesRequestSchema, async () => ({
    resourceTemplates: RESOURCE_TEMPLATES,
  }))
  server.setRequestHandler(ListResourcesRequestSchema, (request) =>
    answered(deps, caller, () => listResources(deps, tenantId, request.params?.cursor)),
  )
  server.setRequestHandler(ReadResourceRequestSchema, (request, extra) =>
    answered(deps, caller, () => readResource(deps, tenantId, request.params.uri, extra.signal)),
  )
  return server
}

/** A resource request's failure as a JSON-RPC error: its data is the error body the route would answer. */
async function answered<T>(deps: McpDeps, caller: McpCaller, run: () => Promise<T>): Promise<T> {
  try {
    return await run()
  } catch (error) {
    if (error instanceof McpError) throw error
    const { status, body } = toErrorBody(error, caller.requestId)
    if (status >= 500) deps.logger.error({ err: error }, 'MCP resource read failed')
    const code =
      status === 404
        ? RESOURCE_NOT_FOUND
        : status < 500
          ? RpcErrorCode.InvalidParams
          : RpcErrorCode.InternalError
    throw new McpError(code, body.error.message, body.error)
  }
}
