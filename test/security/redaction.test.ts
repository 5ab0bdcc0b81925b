import { randomBytes } from 'node:crypto'
import { Cairn } from '@cairn/sdk'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { TestServer } from '../helpers/server.js'
import { startShellServer } from '../helpers/shell-server.js'

/**
 * A secret printed encoded (base64 at each alignment, URL-safe base64, hex, percent-encoded as in
 * a failing `git clone https://user:TOKEN@…`), or written in two pieces a moment apart, reaches
 * neither the streamed reply, nor the turn's stored events and transcript, nor the setup log:
 * read-only keys can read all of them.
 */
let t: TestServer

/** Prints the variable named by argv[1] in every form, some of them in two writes 0.3 s apart. */
const PRINTER = `import base64, os, sys, time, urllib.parse
value = os.environ[sys.argv[1]].encode()
def out(text):
    sys.stdout.write(text)
    sys.stdout.flush()
half = len(value) // 2
out("split:" + value[:half].decode()); time.sleep(0.3); out(value[half:].decode() + "\\n")
for pad in range(3):
    out("b64:%s\\n" % base64.b64encode(b"x" * pad + value).decode())
out("b64url:%s\\n" % base64.urlsafe_b64encode(b"yz" + value).decode())
out("hex:%s\\n" % value.hex())
out("clone:fatal: could not read from https://user:%s@git.example/repo\\n" % urllib.parse.quote(value, safe=""))
encoded = base64.b64encode(value).decode()
out("b64split:" + encoded[:7]); time.sleep(0.3); out(encoded[7:] + "\\n")
`

/** What must not be shown of `value`: itself and the parts of its encodings it alone fixes. */
function shownForms(value: string): string[] {
  const bytes = Buffer.from(value)
  const core = (pad: number, url: boolean) =>
    Buffer.concat([Buffer.alloc(pad), bytes])
      .toString(url ? 'base64url' : 'base64')
      .slice(Math.ceil((pad * 8) / 6), Math.floor(((pad + bytes.length) * 8) / 6))
  return [
    value,
    encodeURIComponent(value),
    bytes.toString('hex'),
    core(0, false),
    core(1, false),
    core(2, false),
    core(2, true),
  ]
}

const token = (label: string) => `${label}/${randomBytes(9).toString('hex')}+a=b&c é`

beforeAll(async () => {
  t = await startShellServer({}, { name: 'printer', files: { 'print.py': PRINTER } })
})

afterAll(async () => {
  await t?.close()
})

describe('redaction of encoded and split secrets', () => {
  it('keeps them out of the streamed reply, its stored events and transcript, and the setup log', async () => {
    const runtime = token('run')
    const setup = token('setup')
    const put = (secrets: Record<string, string>, scope: string) =>
      t.api.call('PUT', '/v1/agents/printer/secrets', { secrets, scope })
    expect((await put({ RUN_TOKEN: runtime }, 'runtime')).status).toBe(200)
    expect((await put({ SETUP_TOKEN: setup }, 'setup')).status).toBe(200)
    const { id } = await t.api.createSession('printer', {
      setup: { command: 'python3 print.py SETUP_TOKEN' },
    })
    const turn = await t.api.send(id, 'python3 print.py RUN_TOKEN')
    expect(turn.terminal?.type, JSON.stringify(turn.events)).toBe('run.completed')
    // Each of the eight lines names the secret in place of its value.
    expect(turn.text.split('[redacted:RUN_TOKEN]').length - 1).toBeGreaterThanOrEqual(8)
    const turnId = (turn.terminal as { turnId: string }).turnId
    const stored = await t.api.call('GET', `/v1/sessions/${id}/turns/${turnId}/events`)
    expect(stored.status).toBe(200)
    const transcript = await t.api.call('GET', `/v1/sessions/${id}/turns`)
    const log = await t.api.call('GET', `/v1/sessions/${id}/setup/log`)
    expect(log.body).toContain('[redacted:SETUP_TOKEN]')
    const seen = {
      stream: JSON.stringify(turn.events),
      storedEvents: JSON.stringify(stored.body),
      transcript: JSON.stringify(transcript.body),
      setupLog: String(log.body),
    }
    const found = Object.entries(seen).flatMap(([where, text]) =>
      [...shownForms(runtime), ...shownForms(setup)]
        .filter((form) => text.includes(form) || text.includes(JSON.stringify(form).slice(1, -1)))
        .map((form) => `${where}: ${form}`),
    )
    expect(found).toEqual([])
  })

  it("keeps them out of a command's output, on pipes and on a terminal, as its log keeps it", async () => {
    const runtime = token('cmd')
    const put = await t.api.call('PUT', '/v1/agents/printer/secrets', {
      secrets: { CMD_TOKEN: runtime },
      scope: 'runtime',
    })
    expect(put.status).toBe(200)
    const { id } = await t.api.createSession('printer')
    const commands = new Cairn({ apiKey: t.key, baseUrl: t.url }).sessions.commands(id)
    const piped = await commands.run(['python3', 'print.py', 'CMD_TOKEN'])
    expect(piped.exitCode, piped.stderr).toBe(0)
    const onTerminal = await commands.start(['python3', 'print.py', 'CMD_TOKEN'], {
      tty: { rows: 24, cols: 200 },
    })
    const screen: Uint8Array[] = []
    await commands.wait(onTerminal.id, { onOutput: (e) => e.type === 'output' && screen.push(e.data) })
    const texts = { piped: piped.stdout, terminal: Buffer.concat(screen).toString() }
    for (const [where, text] of Object.entries(texts)) {
      expect(text.split('[redacted:CMD_TOKEN]').length - 1, where).toBeGreaterThanOrEqual(8)
      expect(
        shownForms(runtime).filter((form) => text.includes(form)),
        where,
      ).toEqual([])
    }
  })
})
