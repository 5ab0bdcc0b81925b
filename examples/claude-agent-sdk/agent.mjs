// A Claude Agent SDK agent on the Cairn jsonl protocol: streams Claude's text as it is written
// and reports every tool Claude uses (tool_use → tool.start, tool_result → tool.end).
import { query } from '@anthropic-ai/claude-agent-sdk'
import { turns } from '/opt/cairn/node/index.mjs'

const options = {
  cwd: process.cwd(),
  includePartialMessages: true,
  // No one is there to approve a tool: allow these, deny the rest. The sandbox is the boundary.
  permissionMode: 'dontAsk',
  allowedTools: ['Read', 'Write', 'Edit', 'Glob', 'Grep', 'Bash'],
  maxTurns: 30,
  ...(process.env.CLAUDE_MODEL ? { model: process.env.CLAUDE_MODEL } : {}),
}

/** A tool_result's content as plain text when it is text blocks, as is otherwise. */
function resultOutput(content) {
  if (!Array.isArray(content)) return content
  if (content.every((part) => part.type === 'text')) return content.map((part) => part.text).join('')
  return content
}

let sessionId // Claude's own session, resumed on each later turn of this process
for await (const turn of turns()) {
  // ~/.claude persists with the session (cairn.yaml `persist:`), so in a fresh sandbox `continue`
  // picks up the conversation Claude stored there on an earlier turn.
  const resume = sessionId ? { resume: sessionId } : turn.turn > 1 ? { continue: true } : {}
  const calls = new Map() // Claude's tool_use id → the kit's tool call id
  let wrote = false
  try {
    for await (const message of query({ prompt: turn.content, options: { ...options, ...resume } })) {
      if (message.type === 'system' && message.subtype === 'init') {
        sessionId = message.session_id
        turn.status(`Claude Code ${message.claude_code_version} · ${message.model}`)
      } else if (message.type === 'stream_event' && message.parent_tool_use_id === null) {
        const event = message.event
        if (event.type === 'content_block_delta' && event.delta.type === 'text_delta') {
          turn.write(event.delta.text)
          wrote = true
        }
      } else if (message.type === 'assistant') {
        for (const block of message.message.content) {
          if (block.type === 'tool_use') calls.set(block.id, turn.toolStart(block.name, block.input))
        }
      } else if (message.type === 'user' && Array.isArray(message.message.content)) {
        for (const block of message.message.content) {
          if (block.type !== 'tool_result' || !calls.has(block.tool_use_id)) continue
          turn.toolEnd(calls.get(block.tool_use_id), resultOutput(block.content), {
            isError: block.is_error === true,
          })
          calls.delete(block.tool_use_id)
        }
      } else if (message.type === 'result') {
        turn.metadata({
          costUsd: message.total_cost_usd,
          numTurns: message.num_turns,
          inputTokens: message.usage.input_tokens,
          outputTokens: message.usage.output_tokens,
        })
        if (message.subtype === 'success' && !message.is_error) {
          if (!wrote) turn.write(message.result)
        } else {
          turn.error(
            message.subtype === 'success' ? message.result : message.errors?.join('; ') || message.subtype,
          )
        }
      }
    }
  } catch (err) {
    turn.error(err instanceof Error ? err.message : String(err))
  }
}
