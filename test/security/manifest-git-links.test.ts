import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject, SHELL_PROJECT } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'

// The manifest reads the agent's `.git` on the host (GET /v1/sessions/{id}/manifest → repo): through
// the workspace reader, which follows no link, so a link in .git never makes the host read its own
// files for the agent.
let t: TestServer

beforeAll(async () => {
  t = await startTestServer()
  expect((await t.api.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
})

const manifestOf = (id: string) => t.api.manifest(id)

describe("the manifest reads .git without following the agent's links", () => {
  it('never follows a link the agent put in .git, nor a ref name that leaves refs/heads', async () => {
    const { id } = await t.api.createSession('shell')
    // HEAD a link to a host file: not read (the reader follows no link).
    await t.api.send(id, 'mkdir -p .git && ln -s /etc/hostname .git/HEAD && echo linked')
    expect((await manifestOf(id)).repo).toBeNull()
    // .git itself a link to a directory elsewhere (here /proc's): not read either.
    await t.api.send(id, 'rm -rf .git && ln -s /proc/self .git && echo linked')
    expect((await manifestOf(id)).repo).toBeNull()
    // A ref that climbs out of .git/refs/heads: the branch is not believed, nothing read through it.
    await t.api.send(
      id,
      'rm -f .git && mkdir .git && echo "ref: refs/heads/../../../../etc/hostname" > .git/HEAD',
    )
    expect((await manifestOf(id)).repo).toEqual({ branch: null, sha: null })
  })
})
