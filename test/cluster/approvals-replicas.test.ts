import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type ApiReplicas, startApiReplicas } from '../helpers/api-replicas.js'
import { testsRunOnPostgres } from '../helpers/postgres.js'
import { makeProject, REVIEWER_PROJECT } from '../helpers/projects.js'

// Human review through two API replicas in front of a remote node (docs/approvals.md): the agent
// asks through one replica, a person answers through the other, which shares only the database
// with the first; the answer's turn runs from the second and reaches the agent on the node.
let cluster: ApiReplicas

beforeAll(async () => {
  cluster = await startApiReplicas(2, 'approvals-replicas')
  expect((await cluster.api(0).deploy(await makeProject(REVIEWER_PROJECT))).status).toBe(201)
}, 180_000)

afterAll(async () => {
  await cluster?.close()
})

describe.skipIf(testsRunOnPostgres())('an approval through two API replicas', () => {
  it('is asked through one replica, answered through the other, and the answer reaches the agent', async () => {
    const one = cluster.api(0)
    const two = cluster.api(1)
    const { id } = await one.createSession('reviewed')
    const run = await one.send(id, 'ask on replica one')
    const requested = run.events.find((e) => e.type === 'approval.requested')
    if (requested?.type !== 'approval.requested') throw new Error(JSON.stringify(run.events))
    const approvalId = requested.approvalId
    expect((await two.call('GET', `/v1/sessions/${id}`)).body.approvalId).toBe(approvalId)
    const answered = await two.call('POST', `/v1/sessions/${id}/approvals/${approvalId}/answer`, {
      decision: 'approve',
      note: 'from replica two',
    })
    expect(answered.status, JSON.stringify(answered.body)).toBe(200)
    const again = await one.call('POST', `/v1/sessions/${id}/approvals/${approvalId}/answer`, {
      decision: 'deny',
    })
    expect(again.body.error.code).toBe('approval_answered')
    let reply = ''
    for (let i = 0; i < 400 && !reply; i++) {
      const turns = (await one.call('GET', `/v1/sessions/${id}/turns`)).body.data as {
        seq: number
        status: string
        response: string
      }[]
      const delivered = turns.find((t) => t.seq === 2 && t.status !== 'running')
      if (delivered) reply = `${delivered.status}: ${delivered.response}`
      else await new Promise((resolve) => setTimeout(resolve, 50))
    }
    expect(reply).toBe(`completed: got ${approvalId} approve from replica two`)
  })
})
