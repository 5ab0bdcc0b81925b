import { newId } from '@cairn/protocol'
import { LocalRuntimePort, type TurnMessage } from '@cairn/runtime/port'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import {
  makeRevision,
  openTestRuntime,
  sessionId,
  type TestRuntime,
} from '../packages/runtime/test/harness.js'
import { SelfFence } from '../packages/server/src/cluster/self-fence.js'
import { reportFencedTurns } from '../packages/server/src/node/fenced-turns.js'
import { quietLogger } from '../packages/server/test/cluster-rows.js'

// (Here, not beside fenced-turns.ts: the test builds a Runtime, which packages/server/src reaches only
// through its port.) A node's own fence stops the sandbox of a running turn: the turn says node_fenced, not that the
// agent crashed. A real runtime, a real agent, the fence that cairn node uses.
const SLOW =
  'while True:\n    line = input()\n    print("working", flush=True)\n    import time; time.sleep(60)\n'

let t: TestRuntime
let local: LocalRuntimePort

beforeAll(async () => {
  t = await openTestRuntime()
  local = new LocalRuntimePort(t.runtime, { clock: { now: () => Date.now() } })
  await makeRevision(t.runtime, 'rev_fenced', { 'agent.py': SLOW })
})

afterAll(async () => {
  await local?.stopAllAgents()
  await t?.close()
})

async function runUntilWorking(port: ReturnType<typeof reportFencedTurns>, id: string) {
  await local.createWorkspace(id, 'rev_fenced', 'ten_a')
  await local.startAgent({
    sessionId: id,
    tenantId: 'ten_a',
    command: ['python3', 'agent.py'],
    protocol: 'stdio',
    env: {},
    limits: { memoryMiB: 256, pids: 64, cpus: 1 },
    turnTimeoutMs: 30_000,
  })
  const messages = port
    .runTurn(id, { prompt: 'go', turn: 1, turnId: newId('turn'), transcript: [] })
    [Symbol.asyncIterator]()
  expect((await messages.next()).value).toMatchObject({ type: 'event' })
  return async () => {
    const rest: TurnMessage[] = []
    for (let m = await messages.next(); !m.done; m = await messages.next()) rest.push(m.value)
    return rest.find((m) => m.type === 'outcome')
  }
}

describe('turns cut by the node fencing itself', () => {
  it('end failed with node_fenced; a sandbox stopped without a fence is still the agent crash it is', async () => {
    const fence = new SelfFence(60_000, { stopAllAgents: () => local.stopAllAgents(), logger: quietLogger })
    fence.renewed(performance.now())
    const port = reportFencedTurns(local, () => fence.generation)

    const cut = await runUntilWorking(port, sessionId('fenced'))
    await fence.fence('test: the lease could not be renewed')
    expect(await cut()).toMatchObject({
      type: 'outcome',
      outcome: { status: 'failed', code: 'node_fenced', cause: 'node_lost' },
    })

    fence.renewed(performance.now())
    const stopped = await runUntilWorking(port, sessionId('stopped'))
    await local.stopAllAgents()
    const outcome = await stopped()
    expect(outcome).toMatchObject({ type: 'outcome', outcome: { status: 'failed' } })
    expect(outcome).not.toMatchObject({ outcome: { code: 'node_fenced' } })
    fence.close()
  })
})
