import { readFileSync } from 'node:fs'
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { assertBuilt, spawnCli } from './helpers/cli.js'
import { REPO_ROOT, startTestServer, type TestServer } from './helpers/server.js'

// The README's first agent, as written there: its cairn.yaml and its program are read out of
// README.md, deployed and run with the commands it shows, twice, so its workspace is seen to last.

/** The fenced block of `lang` whose first line is `# <name>`, without that line. */
function block(markdown: string, lang: string, name: string): string {
  for (const match of markdown.matchAll(/```(\w+)\n([\s\S]*?)```/g)) {
    const [, fence, body = ''] = match
    if (fence === lang && body.startsWith(`# ${name}`)) return body
  }
  throw new Error(`README.md has no ${lang} block starting '# ${name}'`)
}

let t: TestServer
let dir: string
let env: Record<string, string>

beforeAll(async () => {
  assertBuilt()
  t = await startTestServer()
  dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-readme-agent-'))
  env = { CAIRN_API_URL: t.url, CAIRN_API_KEY: t.key, CAIRN_CONFIG_DIR: dir }
})

afterAll(async () => {
  await t?.close()
  if (dir) await rm(dir, { recursive: true, force: true })
})

describe("the README's first agent", () => {
  it('deploys and answers with the commands the README shows, its workspace kept between turns', async () => {
    const readme = readFileSync(path.join(REPO_ROOT, 'README.md'), 'utf8')
    const project = path.join(dir, 'tally')
    await rm(project, { recursive: true, force: true })
    await mkdir(project)
    await writeFile(path.join(project, 'cairn.yaml'), block(readme, 'yaml', 'cairn.yaml'))
    await writeFile(path.join(project, 'tally.py'), block(readme, 'python', 'tally.py'))
    const yamlLines = block(readme, 'yaml', 'cairn.yaml').trim().split('\n').slice(1)
    expect(yamlLines).toHaveLength(5)

    const commands = block(readme, 'sh', 'in its directory').split('\n')
    expect(commands).toContain('cairn deploy')
    const deployed = await spawnCli(['deploy'], env, { cwd: project }).done
    expect(deployed.code, deployed.stderr).toBe(0)
    expect(commands.some((line) => line.startsWith('cairn run tally "hello"'))).toBe(true)
    const first = await spawnCli(['run', 'tally', 'hello'], env, { cwd: project }).done
    expect(first.code, first.stderr).toBe(0)
    expect(first.stdout).toContain('lines kept: 1')
    expect(commands.some((line) => line.startsWith('cairn sessions resume <id>'))).toBe(true)
    const sessions = await t.api.call('GET', '/v1/sessions')
    const [session] = (sessions.body as { data: { id: string }[] }).data
    // A cold start: the sandbox the first turn had is stopped first.
    expect((await t.api.call('POST', `/v1/sessions/${session?.id}/end`)).status).toBe(200)
    const resumed = await spawnCli(['sessions', 'resume', session?.id ?? ''], env, {
      cwd: project,
      input: 'again\n',
    }).done
    expect(resumed.code, resumed.stderr).toBe(0)
    expect(resumed.stdout).toContain('lines kept: 2')
  })
})
