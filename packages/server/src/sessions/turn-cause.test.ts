import { CairnProblem, ERROR_CODES, STATUS_CAUSES } from '@cairn/protocol'
import { describe, expect, it } from 'vitest'
import { causeOfProblem } from './turn-runner.js'

// A turn that threw leaves its session failed with a cause: the cause names what happened where
// the error's code names one, never the agent's crash for a lost node or an outrun move.
describe('the cause a failed turn gives its session', () => {
  it('is the error code itself wherever that code is a status cause', () => {
    const shared = STATUS_CAUSES.filter((cause) => Object.hasOwn(ERROR_CODES, cause))
    expect(shared).toEqual(
      expect.arrayContaining(['node_lost', 'replica_lost', 'state_lost', 'quota_exceeded']),
    )
    for (const code of shared) expect(causeOfProblem(new CairnProblem(code as never, 'x'))).toBe(code)
  })

  it('is moved for a turn every node refused stale_epoch, turn_failed for no sandbox, and the crash for anything else', () => {
    expect(causeOfProblem(new CairnProblem('stale_epoch', 'moved on'))).toBe('moved')
    expect(causeOfProblem(new CairnProblem('sandbox_limit_reached', 'all busy'))).toBe('turn_failed')
    expect(causeOfProblem(new CairnProblem('internal', 'x'))).toBe('agent_crash')
    expect(causeOfProblem(undefined)).toBe('agent_crash')
  })
})
