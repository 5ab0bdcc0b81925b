// An OpenAI Agents SDK agent on the Cairn jsonl protocol: streams the model's text and reports
// its tool calls through the kit's tool() wrapper.
import { readdir, readFile } from 'node:fs/promises'
import path from 'node:path'
import { Agent, assistant, run, tool, user } from '@openai/agents'
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

const listFiles = tool({
  name: 'list_files',
  description: 'List the files in a directory of the workspace.',
  parameters: z.object({
    path: z.string().describe('Directory, relative to the workspace; "." for its root'),
  }),
  execute: reported('list_files', async ({ path: dir }) => readdir(inWorkspace(dir))),
})

const readTextFile = tool({
  name: 'read_file',
  description: 'Read a text file of the workspace.',
  parameters: z.object({ path: z.string().describe('File, relative to the workspace') }),
  execute: reported('read_file', async ({ path: file }) =>
    (await readFile(inWorkspace(file), 'utf8')).slice(0, 20_000),
  ),
})

const agent = new Agent({
  name: 'Workspace assistant',
  instructions: 'You help with the files in this workspace. Use the tools to look before answering.',
  tools: [listFiles, readTextFile],
  ...(process.env.OPENAI_MODEL ? { model: process.env.OPENAI_MODEL } : {}),
})

for await (const turn of turns()) {
  // The conversation so far comes from the session transcript, so a fresh sandbox has it too.
  const history = turn.transcript().map((m) => (m.role === 'user' ? user(m.content) : assistant(m.content)))
  try {
    const result = await run(agent, [...history, user(turn.content)], { stream: true })
    for await (const event of result) {
      if (event.type === 'raw_model_stream_event' && event.data.type === 'output_text_delta') {
        turn.write(event.data.delta)
      } else if (event.type === 'agent_updated_stream_event') {
        turn.status(`agent: ${event.agent.name}`)
      }
    }
    await result.completed
    if (result.error) throw result.error
    const usage = { inputTokens: 0, outputTokens: 0 }
    for (const response of result.rawResponses) {
      usage.inputTokens += response.usage.inputTokens
      usage.outputTokens += response.usage.outputTokens
    }
    turn.metadata({ usage, lastResponseId: result.lastResponseId })
  } catch (err) {
    turn.error(err instanceof Error ? err.message : String(err))
  }
}
