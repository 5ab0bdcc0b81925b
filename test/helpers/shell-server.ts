import { expect } from 'vitest'
import { makeProject, SHELL_AGENT } from './projects.js'
import { startTestServer, type TestServer } from './server.js'

/** The shell agent's project (SHELL_AGENT as `bash agent.sh`) deployed as `name`, with `files` beside it. */
export interface ShellAgent {
  name?: string
  files?: Record<string, string>
}

/** A test server (`options` as for startTestServer) with the shell agent deployed (see ShellAgent). */
export async function startShellServer(
  options: Parameters<typeof startTestServer>[0] = {},
  { name = 'shell', files = {} }: ShellAgent = {},
): Promise<TestServer> {
  const t = await startTestServer(options)
  const project = await makeProject({
    'cairn.yaml': `name: ${name}\ncommand: bash agent.sh\n`,
    'agent.sh': SHELL_AGENT,
    ...files,
  })
  expect((await t.api.deploy(project)).status).toBe(201)
  return t
}
