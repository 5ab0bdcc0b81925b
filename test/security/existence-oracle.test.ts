import { writeFile } from 'node:fs/promises'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { scratchDir } from '../helpers/scratch.js'
import type { TestServer } from '../helpers/server.js'
import { startShellServer } from '../helpers/shell-server.js'

/**
 * An agent links a name the host looks at (`.cairn/memory.proposed.md`, asked about after every
 * turn and by `POST …/memory/promote`) to a host path: whether that path exists on the host must
 * not change any answer. The host's existence check walks the tree by descriptors like its reads.
 */
let t: TestServer

beforeAll(async () => {
  t = await startShellServer()
})

afterAll(async () => {
  await t?.close()
})

/** Status and error code of a promote while `.cairn/memory.proposed.md` is set up by `command`. */
async function promoteWith(command: string): Promise<{ status: number; code: unknown }> {
  const { id } = await t.api.createSession('shell')
  expect((await t.api.send(id, command)).text).toContain('[exit 0]')
  const res = await t.api.call('POST', `/v1/sessions/${id}/memory/promote`)
  return { status: res.status, code: res.body?.error?.code ?? res.body?.code }
}

describe('host-side existence checks on a workspace', () => {
  it('answer the same for a link to a host file that exists and one that does not', async () => {
    const answers = []
    for (const target of ['/etc/shadow', '/etc/cairn-no-such-file', '/root/.ssh', '/root/no-such-dir'])
      answers.push(await promoteWith(`mkdir -p .cairn && ln -s ${target} .cairn/memory.proposed.md`))
    expect(answers.slice(1)).toEqual([answers[0], answers[0], answers[0]])
  })

  it('answer the same when a parent of the name is the link', async () => {
    // A host directory that holds the name, and one that does not exist.
    const host = await scratchDir('oracle-')
    await writeFile(path.join(host, 'memory.proposed.md'), 'host file\n')
    const answers = []
    for (const target of [host, `${host}-gone`]) answers.push(await promoteWith(`ln -s ${target} .cairn`))
    expect(answers[1]).toEqual(answers[0])
  })
})
