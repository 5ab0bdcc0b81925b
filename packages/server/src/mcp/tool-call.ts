import type { AgentService } from '../agents/agent-service.js'
import type { CommandService } from '../commands/command-service.js'
import type { SessionService } from '../sessions/session-service.js'
import type { WorkspaceService } from '../workspace/workspace-service.js'

/** The services the native routes call; every tool is a call of one of them. */
export interface McpServices {
  agents: AgentService
  commands: CommandService
  sessions: SessionService
  workspace: WorkspaceService
}

/** What a tool is called with besides its arguments. */
export interface ToolCall {
  tenantId: string
  /** Tells the client how the call is going (an MCP progress notification, when it asked for them). */
  progress(message: string): Promise<void> | undefined
  /** Aborted when the client's connection goes away. */
  signal: AbortSignal
}

/** A tool's answer: the structured result, and the text a model reads (its JSON by default). */
export interface ToolAnswer {
  structured: Record<string, unknown>
  text?: string
}
