import { mkdir, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject } from '../helpers/projects.js'
import { Api, packDir, startTestServer, type TestServer } from '../helpers/server.js'

// A dependency environment is built once per key and mounted read-only at /env in every session
// of every revision with that key. These attacks make the key match while the install reads
// something else: the attacker's code must never reach another tenant's (or project's) sessions.

let t: TestServer
let tenantB: Api

beforeAll(async () => {
  t = await startTestServer({ server: { rateLimitPerSecond: 0 } })
  const key = await t.api.call('POST', '/v1/keys', { tenant: 'tenant-b', role: 'admin' })
  expect(key.status).toBe(201)
  tenantB = new Api(t.url, key.body.key)
})

afterAll(async () => {
  await t?.close()
})

/** Deploys and waits for the build; answers the revision and its build log. */
async function deploy(api: Api, project: string): Promise<{ status: string; envKey: string; log: string }> {
  const res = await api.call('POST', '/v1/agents?wait=true', await packDir(project))
  expect(res.status, JSON.stringify(res.body)).toBe(201)
  const { id, agentId, envKey, status } = res.body.revision
  const log = await api.call('GET', `/v1/agents/${agentId}/revisions/${id}/logs`)
  return { status, envKey, log: (log.body.lines as string[]).join('\n') }
}

async function reply(api: Api, agent: string): Promise<string> {
  const session = (await api.call('POST', '/v1/sessions', { agent })).body as { id: string }
  expect(session.id).toBeTruthy()
  return (await api.send(session.id, 'who')).text.trim()
}

// A PEP 517 backend inside the project (no index needed) that packages the project's `tool.py`.
// The agent imports `tool` from the environment: whichever tool.py the environment was built from
// is the code its sessions run (a `sitecustomize.py` in the wheel would run in every Python too;
// here the kit's own shim comes first on the path, so the import is the clearest witness).
const PYPROJECT = [
  '[build-system]',
  'requires = []',
  'build-backend = "backend"',
  'backend-path = ["."]',
  '',
  '[project]',
  'name = "tool"',
  'version = "1.0"',
  '',
].join('\n')
const BACKEND = [
  'import base64, hashlib, os, zipfile',
  'HERE = os.path.dirname(os.path.abspath(__file__))',
  'def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):',
  '    dist = "tool-1.0.dist-info"',
  '    files = {',
  '        "tool.py": open(os.path.join(HERE, "src", "tool.py"), "rb").read(),',
  '        dist + "/METADATA": b"Metadata-Version: 2.1\\nName: tool\\nVersion: 1.0\\n",',
  '        dist + "/WHEEL": b"Wheel-Version: 1.0\\nGenerator: backend\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",',
  '    }',
  '    def line(p, d):',
  '        digest = base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode()',
  '        return "%s,sha256=%s,%d" % (p, digest, len(d))',
  '    record = [line(p, d) for p, d in files.items()] + [dist + "/RECORD,,"]',
  '    name = "tool-1.0-py3-none-any.whl"',
  '    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as whl:',
  '        for p, d in files.items():',
  '            whl.writestr(p, d)',
  '        whl.writestr(dist + "/RECORD", "\\n".join(record) + "\\n")',
  '    return name',
  '',
].join('\n')
// The project keeps the module in src/, so `import tool` from /workspace finds the installed one.
const PY_AGENT = 'import tool\nwhile True:\n    input()\n    print(tool.WHO, flush=True)\n'

async function pyProject(name: string, who: string): Promise<string> {
  const dir = await makeProject({
    'cairn.yaml': `name: ${name}\ncommand: python3 agent.py\n`,
    'pyproject.toml': PYPROJECT,
    'backend.py': BACKEND,
    'agent.py': PY_AGENT,
  })
  await mkdir(path.join(dir, 'src'))
  await writeFile(path.join(dir, 'src', 'tool.py'), `WHO = ${JSON.stringify(who)}\n`)
  return dir
}

// The npm variant: the project's own postinstall script (byte-identical manifest) copies a file of
// the project tree into node_modules, where the agent loads it.
const PACKAGE_JSON = JSON.stringify({
  name: 'app',
  version: '1.0.0',
  scripts: {
    postinstall:
      "node -e \"const fs=require('fs');fs.mkdirSync('node_modules/helper',{recursive:true});let s='module.exports=\\'clean\\'';try{s=fs.readFileSync('/src/helper.js','utf8')}catch{}fs.writeFileSync('node_modules/helper/index.js',s)\"",
  },
})
const NODE_AGENT =
  "const rl = require('node:readline').createInterface({ input: process.stdin })\nrl.on('line', () => console.log(require('helper')))\n"

function nodeProject(name: string, helper: string): Promise<string> {
  return makeProject({
    'cairn.yaml': `name: ${name}\ncommand: node agent.js\n`,
    'package.json': PACKAGE_JSON,
    'agent.js': NODE_AGENT,
    'helper.js': `module.exports = ${JSON.stringify(helper)}\n`,
  })
}

describe('dependency environments are never shared with code they were not built from', () => {
  it("a local build backend of tenant A never runs in tenant B's sessions (byte-identical pyproject.toml)", async () => {
    const a = await deploy(t.api, await pyProject('tool', 'tenant-a-code'))
    expect(a.status, a.log).toBe('READY')
    expect(await reply(t.api, 'tool')).toBe('tenant-a-code')

    const b = await deploy(tenantB, await pyProject('tool', 'tenant-b-code'))
    expect(b.status, b.log).toBe('READY')
    expect(await reply(tenantB, 'tool')).toBe('tenant-b-code')
    expect(b.log).not.toContain('reusing environment')
    expect(b.envKey).not.toBe(a.envKey)
  })

  it('within a tenant, a project whose build reads other bytes gets its own environment', async () => {
    const first = await deploy(t.api, await pyProject('tool-one', 'one'))
    const second = await deploy(t.api, await pyProject('tool-two', 'two'))
    expect(second.status, second.log).toBe('READY')
    expect(second.envKey).not.toBe(first.envKey)
    expect(await reply(t.api, 'tool-two')).toBe('two')
  })

  it("an npm lifecycle script's reads of tenant A's project never reach tenant B (byte-identical package.json)", async () => {
    const a = await deploy(t.api, await nodeProject('app', 'tenant-a-code'))
    expect(a.status, a.log).toBe('READY')
    const b = await deploy(tenantB, await nodeProject('app', 'tenant-b-code'))
    expect(b.status, b.log).toBe('READY')
    expect(await reply(tenantB, 'app')).not.toBe('tenant-a-code')
    expect(b.log).not.toContain('reusing environment')
  })
})
