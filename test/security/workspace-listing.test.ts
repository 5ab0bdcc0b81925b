import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { TestServer } from '../helpers/server.js'
import { startShellServer } from '../helpers/shell-server.js'

/**
 * A directory listing is answered whole, so its size is the agent's to choose: a directory of
 * 500,000 empty files with 240-byte names (about 300 MB of metadata, well within the workspace
 * quota) cost one listing 1.2 GB of the server's memory and 12 s of its event loop, and a few
 * at once would take the server down for every tenant. Listings are capped.
 */
let t: TestServer

beforeAll(async () => {
  t = await startShellServer({}, { name: 'shell-listing' })
})

afterAll(async () => {
  await t?.close()
})

const MAX_ENTRIES = 50_000

/** Makes `count` empty files in `dir` named by their number padded to `width` (one line: the shell agent reads lines). */
const MAKE_FILES =
  'python3 -c "import os, sys; d, n, w = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]); ' +
  "os.makedirs(d, exist_ok=True); [os.close(os.open(os.path.join(d, str(i).rjust(w, 'x')), os.O_CREAT | os.O_WRONLY, 0o644)) for i in range(n)]; " +
  "print('made', n)\""

describe('workspace listings', () => {
  it('refuses a directory of more entries, or longer names, than a listing may carry (413 payload_too_large)', {
    timeout: 240_000,
  }, async () => {
    const { id } = await t.api.createSession('shell-listing', { autoSnapshots: false })
    const send = async (command: string) => {
      const result = await t.api.send(id, command)
      expect(result.terminal?.type, JSON.stringify(result.events)).toBe('run.completed')
      return result.text
    }
    expect(await send(`${MAKE_FILES} many ${MAX_ENTRIES + 1} 8`)).toContain(`made ${MAX_ENTRIES + 1}`)
    const tooMany = await t.api.call('GET', `/v1/sessions/${id}/files?path=many`)
    expect(tooMany.status, JSON.stringify(tooMany.body).slice(0, 500)).toBe(413)
    expect(tooMany.body.error.code).toBe('payload_too_large')

    // At the cap, the listing is answered.
    expect(await send('rm many/xxxxxxx0 && echo removed')).toContain('removed')
    const atCap = await t.api.call('GET', `/v1/sessions/${id}/files?path=many`)
    expect(atCap.status).toBe(200)
    expect(atCap.body.data).toHaveLength(MAX_ENTRIES)

    // Fewer entries, but under a deep path: every entry carries the whole path, so the bytes count too.
    const deep = Array.from({ length: 15 }, () => 'd'.repeat(250)).join('/')
    expect(await send(`${MAKE_FILES} ${deep} 5000 200`)).toContain('made 5000')
    const long = await t.api.call('GET', `/v1/sessions/${id}/files?path=${deep}`)
    expect(long.status, JSON.stringify(long.body).slice(0, 500)).toBe(413)
    expect(long.body.error.code).toBe('payload_too_large')
  })
})

describe('workspace diffs', () => {
  it('stop at the path bytes a diff may carry, and say so (truncated)', { timeout: 240_000 }, async () => {
    const { id } = await t.api.createSession('shell-listing', { autoSnapshots: false })
    const send = async (command: string) => {
      const result = await t.api.send(id, command)
      expect(result.terminal?.type, JSON.stringify(result.events)).toBe('run.completed')
      return result.text
    }
    // 20,000 entries (far under the diff's 100,000) whose paths are about 4,000 bytes each: 80 MB.
    const deep = Array.from({ length: 15 }, () => 'd'.repeat(250)).join('/')
    expect(await send(`${MAKE_FILES} ${deep} 20000 200`)).toContain('made 20000')
    const diff = await t.api.call('GET', `/v1/sessions/${id}/diff`)
    expect(diff.status).toBe(200)
    expect(diff.body.truncated).toBe(true)
    expect(JSON.stringify(diff.body).length).toBeLessThan(40 * 1024 * 1024)
    // A diff that fits is whole.
    expect(await send(`rm -rf ${deep.split('/')[0]} && mkdir small && touch small/a && echo done`)).toContain(
      'done',
    )
    const small = await t.api.call('GET', `/v1/sessions/${id}/diff`)
    expect(small.body.truncated).toBe(false)
    expect(small.body.added).toEqual(expect.arrayContaining(['small', 'small/a']))
  })
})
