// A LangChain.js agent on the Cairn jsonl protocol: streams the model's tokens and reports its
// tool calls through the kit's tool() wrapper.
import { readdir, readFile } from 'node:fs/promises'
import path from 'node:path'
import { ChatAnthropic } from '@langchain/anthropic'
import { AIMessageChunk, createAgent, tool } from 'langchain'
import { z } from 'zod'
import { tool as reported, turns } from '/opt/cairn/node/index.mjs'

/** Paths stay inside the session's workspace (the working directory). */
const inWorkspace = (p) => {
  const full = path.resolve(p)
  if (full !== process.cwd() && !full.startsWith(process.cwd() + path.sep)) {
    throw new Error(`${p} is outside the workspace`)
  }
  return full
}

const listFiles = tool(
  reported('list_files', async ({ path: dir }) => readdir(inWorkspace(dir))),
  {
    name: 'list_files',
    description: 'List the files in a directory of the workspace.',
    schema: z.object({ path: z.string().describe('Directory, relative to the workspace; "." for its root') }),
  },
)

const readTextFile = tool(
  reported('read_file', async ({ path: file }) =>
    (await readFile(inWorkspace(file), 'utf8')).slice(0, 20_000),
  ),
  {
    name: 'read_file',
    description: 'Read a text file of the workspace.',
    schema: z.object({ path: z.string().describe('File, relative to the workspace') }),
  },
)

const agent = createAgent({
  model: new ChatAnthropic({ model: process.env.ANTHROPIC_MODEL ?? 'claude-sonnet-4-6' }),
  tools: [listFiles, readTextFile],
  systemPrompt: 'You help with the files in this workspace. Use the tools to look before answering.',
})

for await (const turn of turns()) {
  // The conversation so far comes from the session transcript, so a fresh sandbox has it too.
  const messages = [...turn.transcript(), { role: 'user', content: turn.content }].map((m) => ({
    role: m.role,
    content: m.content,
  }))
  const usage = { input_tokens: 0, output_tokens: 0 }
  try {
    const stream = await agent.stream({ messages }, { streamMode: 'messages' })
    for await (const [message] of stream) {
      if (!AIMessageChunk.isInstance(message)) continue // tool results: reported by the tools
      if (message.text) turn.write(message.text)
      // Chunks carry usage increments (AIMessageChunk.concat adds them up the same way).
      usage.input_tokens += message.usage_metadata?.input_tokens ?? 0
      usage.output_tokens += message.usage_metadata?.output_tokens ?? 0
    }
    turn.metadata({ usage })
  } catch (err) {
    turn.error(err instanceof Error ? err.message : String(err))
  }
}
