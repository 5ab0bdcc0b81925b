// A Mastra agent on the Cairn jsonl protocol: maps Mastra's stream (text deltas, tool calls and
// their results) to the kit's frames.
import { readdir, readFile } from 'node:fs/promises'
import path from 'node:path'
import { Agent } from '@mastra/core/agent'
import { createTool } from '@mastra/core/tools'
import { z } from 'zod'
import { turns } from '/opt/cairn/node/index.mjs'

/** Paths stay inside the session's workspace (the working directory). */
const inWorkspace = (p) => {
  const full = path.resolve(p)
  if (full !== process.cwd() && !full.startsWith(process.cwd() + path.sep)) {
    throw new Error(`${p} is outside the workspace`)
  }
  return full
}

const listFiles = createTool({
  id: 'list_files',
  description: 'List the files in a directory of the workspace.',
  inputSchema: z.object({
    path: z.string().describe('Directory, relative to the workspace; "." for its root'),
  }),
  execute: async ({ path: dir }) => ({ files: await readdir(inWorkspace(dir)) }),
})

const readTextFile = createTool({
  id: 'read_file',
  description: 'Read a text file of the workspace.',
  inputSchema: z.object({ path: z.string().describe('File, relative to the workspace') }),
  execute: async ({ path: file }) => ({ text: (await readFile(inWorkspace(file), 'utf8')).slice(0, 20_000) }),
})

const agent = new Agent({
  id: 'workspace-assistant',
  name: 'Workspace assistant',
  instructions: 'You help with the files in this workspace. Use the tools to look before answering.',
  // Mastra's model router reads the provider's key (ANTHROPIC_API_KEY) from the environment.
  model: process.env.MASTRA_MODEL ?? 'anthropic/claude-sonnet-4-6',
  tools: { listFiles, readTextFile },
})

for await (const turn of turns()) {
  // The conversation so far comes from the session transcript, so a fresh sandbox has it too.
  const messages = [...turn.transcript(), { role: 'user', content: turn.content }].map((m) => ({
    role: m.role,
    content: m.content,
  }))
  const calls = new Map() // Mastra's toolCallId → the kit's tool call id
  try {
    const stream = await agent.stream(messages)
    let failure
    for await (const chunk of stream.fullStream) {
      const { payload } = chunk
      if (chunk.type === 'text-delta') {
        turn.write(payload.text)
      } else if (chunk.type === 'tool-call') {
        calls.set(payload.toolCallId, turn.toolStart(payload.toolName, payload.args))
      } else if (chunk.type === 'tool-result' && calls.has(payload.toolCallId)) {
        turn.toolEnd(calls.get(payload.toolCallId), payload.result, { isError: payload.isError === true })
      } else if (chunk.type === 'tool-error' && calls.has(payload.toolCallId)) {
        turn.toolEnd(calls.get(payload.toolCallId), String(payload.error?.message ?? payload.error), {
          isError: true,
        })
      } else if (chunk.type === 'error') {
        failure = payload.error
      }
    }
    if (failure) throw failure
    turn.metadata({ usage: await stream.usage })
  } catch (err) {
    turn.error(err instanceof Error ? err.message : String(err?.message ?? err))
  }
}
