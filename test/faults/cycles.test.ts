import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'

// 10 sessions at once, each through CYCLES turns; keepWarmMs 0 stops the sandbox after every turn,
// so every turn is a resume on a fresh sandbox that must find exactly what the last one wrote.
const SESSIONS = 10
const CYCLES = Number(process.env.CAIRN_FAULT_CYCLES ?? 1000)

let t: TestServer

beforeAll(async () => {
  t = await startTestServer({ server: { rateLimitPerSecond: 0 } })
  const keeper = await makeProject({
    'cairn.yaml': 'name: keeper\ncommand: python3 keeper.py\n',
    'keeper.py': [
      'import hashlib, os',
      'while True:',
      '    n = int(input())',
      '    lines = open("state.txt").read().splitlines() if os.path.exists("state.txt") else []',
      '    digest = open("digest.txt").read() if os.path.exists("digest.txt") else ""',
      '    expected = hashlib.sha256("\\n".join(lines).encode()).hexdigest() if lines else ""',
      '    ok = len(lines) == n - 1 and digest == expected',
      '    lines.append("cycle %d %s" % (n, os.urandom(16).hex()))',
      '    open("state.txt", "w").write("\\n".join(lines) + "\\n")',
      '    open("digest.txt", "w").write(hashlib.sha256("\\n".join(lines).encode()).hexdigest())',
      '    print("ok" if ok else "CORRUPT lines=%d digest=%s" % (len(lines) - 1, digest[:8]))',
    ].join('\n'),
  })
  expect((await t.api.deploy(keeper)).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
})

describe('write → sandbox stopped → resume → verify', () => {
  it(`${SESSIONS} sessions × ${CYCLES} cycles lose and corrupt nothing`, async () => {
    const sessions = await Promise.all(
      Array.from({ length: SESSIONS }, () =>
        t.api.createSession('keeper', { keepWarmMs: 0, autoSnapshots: false }),
      ),
    )
    const failures: string[] = []
    await Promise.all(
      sessions.map(async ({ id }) => {
        for (let n = 1; n <= CYCLES; n++) {
          const result = await t.api.send(id, String(n))
          if (result.text !== 'ok\n' || result.terminal?.type !== 'run.completed') {
            failures.push(`${id} cycle ${n}: ${result.text} ${JSON.stringify(result.terminal)}`)
            return
          }
        }
      }),
    )
    expect(failures).toEqual([])
    for (const { id } of sessions) {
      const info = await t.api.call('GET', `/v1/sessions/${id}`)
      expect(info.body).toMatchObject({ status: 'idle', turnCount: CYCLES, warm: false })
    }
    // 10,000 cold starts: on PostgreSQL each one's dozen queries cross a socket (about a quarter
    // slower than SQLite on a loaded 2-CPU machine), hence the room.
  }, 900_000)
})
