import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { previewFetch } from '../../../../test/helpers/preview.js'
import { makeProject, SHELL_PROJECT } from '../../../../test/helpers/projects.js'
import { startTestServer, type TestServer } from '../../../../test/helpers/server.js'
import { type SessionObserver, unchangedByAll } from './session-observer.js'

describe('unchangedByAll', () => {
  const says = (answer: boolean): SessionObserver => ({ unchanged: async () => answer })

  it('counts a turn unchanged only when every observer that answers says so, and never when none answers', async () => {
    expect(await unchangedByAll([], 'ses_x')).toBe(false)
    expect(await unchangedByAll([{ ended: () => undefined }], 'ses_x')).toBe(false)
    expect(await unchangedByAll([says(true)], 'ses_x')).toBe(true)
    expect(await unchangedByAll([says(true), { ended: () => undefined }, says(true)], 'ses_x')).toBe(true)
    expect(await unchangedByAll([says(true), says(false)], 'ses_x')).toBe(false)
  })

  it('asks no further once one observer says the workspace changed', async () => {
    const asked: string[] = []
    const answering = (name: string, answer: boolean): SessionObserver => ({
      unchanged: async (id) => {
        asked.push(`${name} ${id}`)
        return answer
      },
    })
    const [first, second] = [answering('first', false), answering('second', true)]
    expect(await unchangedByAll([first, second], 'ses_y')).toBe(false)
    expect(asked).toEqual(['first ses_y'])
  })
})

/**
 * The observers server.ts passes to the session service, seen from outside: the snapshot policy
 * snapshots a new session, stands on that snapshot for a turn that wrote nothing, and takes a new
 * one after a turn that wrote; the previews revoke an ended session's URLs.
 */
describe('session observers wired by the composition root', () => {
  let t: TestServer

  beforeAll(async () => {
    t = await startTestServer()
    expect((await t.api.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
  })

  afterAll(async () => {
    await t?.close()
  })

  const snapshots = async (id: string) =>
    (await t.api.call('GET', `/v1/sessions/${id}/snapshots`)).body.data as {
      id: string
      turn: number
      throughTurn: number
    }[]
  /** The snapshot that stands for `turn` (taken in the background once the turn ends). */
  const standingFor = async (id: string, turn: number): Promise<string> => {
    for (let i = 0; i < 200; i++) {
      const found = (await snapshots(id)).find((s) => s.turn <= turn && turn <= s.throughTurn)
      if (found) return found.id
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
    throw new Error(`no snapshot stands for turn ${turn}`)
  }

  it('snapshot policy: created, before and after each turn, extended over a turn that changed nothing', async () => {
    const { id } = await t.api.createSession('shell')
    const atCreation = await t.api.snapshotAfter(id, 0)
    expect((await t.api.send(id, 'echo hello')).text).toBe('hello\n[exit 0]\n')
    // Taken with the warm sandbox frozen: the policy marks what the workspace looked like.
    const afterFirst = await t.api.snapshotAfter(id, 1)
    expect(afterFirst).not.toBe(atCreation)
    expect((await t.api.send(id, 'echo again')).text).toBe('again\n[exit 0]\n')
    // Turn 2 wrote nothing: the snapshot after turn 1 stands for it too (no new subvolume).
    expect(await standingFor(id, 2)).toBe(afterFirst)
    expect((await t.api.send(id, 'echo x > f.txt')).text).toBe('[exit 0]\n')
    const afterWrite = await t.api.snapshotAfter(id, 3)
    expect(afterWrite).not.toBe(afterFirst)
    expect((await snapshots(id)).map((s) => s.id)).toEqual(
      expect.arrayContaining([atCreation, afterFirst, afterWrite]),
    )
    // Undo of turn 3 goes back to the snapshot the observer kept for turn 2.
    expect((await t.api.call('POST', `/v1/sessions/${id}/undo`)).status).toBe(200)
    expect((await t.api.send(id, 'ls')).text).toBe('agent.sh\ncairn.yaml\n[exit 0]\n')
  })

  it('previews: ending a session revokes its preview URLs', async () => {
    const { id } = await t.api.createSession('shell')
    const minted = await t.api.call('POST', `/v1/sessions/${id}/ports/8000/url`, { ttlMs: 60_000 })
    expect(minted.status).toBe(200)
    const url = (minted.body.url as string).replace('/?', '/x?')
    // Accepted (no sandbox runs yet: 409), then revoked once the session ends.
    expect((await previewFetch(url)).status).toBe(409)
    expect((await t.api.call('POST', `/v1/sessions/${id}/end`)).status).toBe(200)
    const ended = await previewFetch(url)
    expect(ended.status).toBe(403)
    expect(await ended.json()).toMatchObject({ error: { details: { reason: 'revoked' } } })
  })
})
