import { execFileSync } from 'node:child_process'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { spawnCli } from './helpers/cli.js'
import { makeProject, SHELL_AGENT } from './helpers/projects.js'
import { startTestServer, type TestServer } from './helpers/server.js'

// One Debian image for the whole file (minbase + two packages, built once from this host's mirror
// through the egress proxy; every later revision with the same recipe reuses it).
const IMAGE_YAML = 'image: debian:bookworm\npackages: [ripgrep, python3-pip]\n'

let t: TestServer
let revisionId = ''

/** A wheel written by hand (pip installs a wheel without a build backend or a network). */
function writeWheel(dir: string): string {
  const name = 'hello_cairn-1.0-py3-none-any.whl'
  execFileSync('python3', [
    '-c',
    [
      'import sys, zipfile',
      'files = {"hello_cairn/__init__.py": "VERSION = \\"1.0\\"\\n",',
      ' "hello_cairn-1.0.dist-info/METADATA": "Metadata-Version: 2.1\\nName: hello-cairn\\nVersion: 1.0\\n",',
      ' "hello_cairn-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\\nGenerator: hand\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}',
      'files["hello_cairn-1.0.dist-info/RECORD"] = "".join(n + ",,\\n" for n in files) + "hello_cairn-1.0.dist-info/RECORD,,\\n"',
      'with zipfile.ZipFile(sys.argv[1], "w") as z:',
      '    for n, b in files.items(): z.writestr(n, b)',
    ].join('\n'),
    path.join(dir, name),
  ])
  return name
}

async function waitReady(
  agent: string,
  timeoutMs = 240_000,
): Promise<{ status: string; id: string; error: string | null }> {
  const until = Date.now() + timeoutMs
  for (;;) {
    const res = await t.api.call('GET', `/v1/agents/${agent}`)
    const revision = res.body.revisions?.[0]
    if (revision && revision.status !== 'DEPLOYING') return revision
    if (Date.now() > until) throw new Error(`revision of ${agent} still DEPLOYING`)
    await new Promise((r) => setTimeout(r, 500))
  }
}

async function shell(sessionId: string, line: string): Promise<string> {
  const reply = await t.api.send(sessionId, line)
  expect(reply.terminal?.type, JSON.stringify(reply.events.slice(-3))).toBe('run.completed')
  return reply.text
}

beforeAll(async () => {
  t = await startTestServer({ server: { defaultImage: 'host' } })
  const dir = await makeProject({
    // The revision's setup and each session's setup phase run on the image too (rg is not on the host).
    'cairn.yaml': [
      'name: imaged',
      'command: bash agent.sh',
      IMAGE_YAML.trim(),
      'setup: sh -c "rg --version | head -1 > rg-at-build.txt"',
      'session:',
      '  setup: sh -c "rg --version | head -1 > rg-at-session.txt"',
      '',
    ].join('\n'),
    'agent.sh': SHELL_AGENT,
  })
  writeWheel(dir)
  const deployed = await t.api.deploy(dir)
  expect(deployed.status, JSON.stringify(deployed.body)).toBe(201)
  const revision = await waitReady('imaged')
  expect(revision.status, revision.error ?? '').toBe('READY')
  revisionId = revision.id
}, 300_000)

afterAll(async () => {
  await t?.close()
})

describe('agent images', () => {
  it('builds the image once, logs it, and a revision with the same recipe reuses it at once', async () => {
    const log = await t.api.call('GET', `/v1/agents/imaged/revisions/${revisionId}/logs`)
    const lines = JSON.stringify(log.body)
    expect(lines).toMatch(/image: building debian-[0-9a-f]{32}: debian:bookworm \+ python3-pip, ripgrep/)
    expect(lines).toMatch(/image: debian-[0-9a-f]{32} ready/)
    const dir = await makeProject({
      'cairn.yaml': `name: again\ncommand: bash agent.sh\n${IMAGE_YAML}`,
      'agent.sh': SHELL_AGENT,
    })
    const again = await t.api.deploy(dir)
    // Nothing to build: the image with this recipe is there, so the revision is READY in the answer.
    expect(again.status).toBe(201)
    expect(again.body.revision.status).toBe('READY')
    const first = await t.api.call('GET', '/v1/agents/imaged')
    expect(again.body.revision.imageKey).toBe(first.body.revisions[0].imageKey)
    expect(again.body.revision.imageKey).toMatch(/^debian-[0-9a-f]{32}$/)
  })

  it("runs the image's packages, and what a turn installs or edits in the root lasts until the next cold start", async () => {
    const session = await t.api.createSession('imaged', { keepWarmMs: 500 })
    expect(await shell(session.id, 'rg --version | head -1')).toMatch(/^ripgrep \d+\.\d+/)
    expect(await shell(session.id, '. /etc/os-release; echo "$ID $VERSION_CODENAME"')).toBe(
      'debian bookworm\n[exit 0]\n',
    )
    // The hosted docs' examples: a pip install into the system, an /etc/hosts entry.
    const pip = await shell(
      session.id,
      'pip install --no-cache-dir --no-index --quiet /workspace/hello_cairn-1.0-py3-none-any.whl && python3 -c "import hello_cairn; print(hello_cairn.__file__, hello_cairn.VERSION)"',
    )
    expect(pip).toMatch(
      /^\/usr\/local\/lib\/python3[.0-9]*\/dist-packages\/hello_cairn\/__init__.py 1.0\n\[exit 0\]\n$/,
    )
    expect(
      await shell(session.id, 'echo "127.0.0.1 myapp.local" >> /etc/hosts && getent hosts myapp.local'),
    ).toBe('127.0.0.1       myapp.local\n[exit 0]\n')
    // A background server started by a turn (the hosted docs' example): it dies with the sandbox.
    expect(await shell(session.id, 'python3 -m http.server 8123 >/dev/null 2>&1 & echo started')).toBe(
      'started\n[exit 0]\n',
    )
    const serving =
      'python3 -c "import urllib.request; urllib.request.urlopen(\'http://127.0.0.1:8123/\', timeout=2)" 2>/dev/null; echo "server $?"'
    expect(await shell(session.id, `sleep 1; ${serving}`)).toBe('server 0\n[exit 0]\n')
    expect(await shell(session.id, 'echo kept > /workspace/kept.txt; touch /usr/bin/planted; echo ok')).toBe(
      'ok\n[exit 0]\n',
    )
    // Same sandbox: still there.
    expect(
      await shell(session.id, 'python3 -c "import hello_cairn" && test -e /usr/bin/planted && echo both'),
    ).toBe('both\n[exit 0]\n')

    await new Promise((r) => setTimeout(r, 1200))
    expect((await t.api.call('GET', `/v1/sessions/${session.id}`)).body.warm).toBe(false)
    const cold = await t.api.send(session.id, 'python3 -c "import hello_cairn" 2>/dev/null; echo "import $?"')
    expect(cold.events.find((e) => e.type === 'run.started')).toMatchObject({ coldStart: true })
    expect(cold.text).toBe('import 1\n[exit 0]\n')
    expect(
      await shell(
        session.id,
        'getent hosts myapp.local; echo "getent $?"; test -e /usr/bin/planted; echo "planted $?"',
      ),
    ).toBe('getent 2\nplanted 1\n[exit 0]\n')
    expect(await shell(session.id, serving)).toBe('server 1\n[exit 0]\n')
    expect(await shell(session.id, 'cat /etc/hosts')).toBe(
      '127.0.0.1\tlocalhost cairn\n::1\tlocalhost ip6-localhost\n[exit 0]\n',
    )
    // Only /workspace keeps what the turns wrote.
    expect(await shell(session.id, 'cat /workspace/kept.txt')).toBe('kept\n[exit 0]\n')
  })

  it('names the image in the session manifest and in GET /v1/images', async () => {
    const session = await t.api.createSession('imaged')
    const manifest = await t.api.call('GET', `/v1/sessions/${session.id}/manifest`)
    expect(manifest.status).toBe(200)
    expect(manifest.body.baseImage).toMatch(
      /^debian:bookworm \+ python3-pip, ripgrep from http.* \(sha256:[0-9a-f]{64}\)$/,
    )
    const images = await t.api.call('GET', '/v1/images')
    expect(images.status).toBe(200)
    expect(images.body.defaultImage).toBe('host')
    expect(images.body.data).toHaveLength(1)
    const [image] = images.body.data
    expect(image).toMatchObject({ kind: 'debian', source: expect.stringMatching(/^debian:bookworm/) })
    expect(image.sizeBytes).toBeGreaterThan(50 * 1024 * 1024)
    expect(image.revisions.map((r: { id: string }) => r.id)).toContain(revisionId)
    expect(image.revisions).toHaveLength(2)
  })

  it("runs the revision's setup and the session's setup phase on the image", async () => {
    const session = await t.api.createSession('imaged')
    expect(await shell(session.id, 'cat rg-at-build.txt rg-at-session.txt')).toMatch(
      /^ripgrep \d+\.\d+\S*\nripgrep \d+\.\d+\S*\n\[exit 0\]\n$/,
    )
  })

  it('cairn images lists the image with its size and the revisions that run on it', async () => {
    const env = { CAIRN_API_URL: t.url, CAIRN_API_KEY: t.key, CAIRN_CONFIG_DIR: path.join(t.dataDir, 'cli') }
    const table = await spawnCli(['images'], env).done
    expect(table.code, table.stderr).toBe(0)
    expect(table.stdout).toMatch(/debian-[0-9a-f]{12}.*debian:bookworm \+ python3-pip, ripgrep.*MiB/)
    expect(table.stdout).toContain(revisionId)
    expect(table.stderr).toContain("Agents without image: run on 'host'")
    const json = await spawnCli(['images', '--json'], env).done
    expect(JSON.parse(json.stdout)).toMatchObject({ defaultImage: 'host', images: [{ kind: 'debian' }] })
  })

  it('refuses an image it cannot make, naming what is accepted', async () => {
    for (const [yaml, message] of [
      ['image: ubuntu\n', /none of 'host', 'debian:<suite>' or an OCI reference/],
      ['image: host\npackages: [git]\n', /'packages' needs a Debian image/],
      ['image: debian:bookworm\npackages: ["rm -rf"]\n', /not a Debian package name/],
    ] as const) {
      const dir = await makeProject({
        'cairn.yaml': `name: bad\ncommand: bash agent.sh\n${yaml}`,
        'agent.sh': SHELL_AGENT,
      })
      const res = await t.api.deploy(dir)
      expect(res.status).toBe(400)
      expect(res.body.error.code).toBe('invalid_manifest')
      expect(res.body.error.message).toMatch(message)
    }
  })
})
