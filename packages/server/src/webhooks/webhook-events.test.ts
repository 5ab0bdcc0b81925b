import { describe, expect, it } from 'vitest'
import { messagesOf, retryDelayMs } from './webhook-events.js'

const row = (source: string, data: Record<string, unknown>) => ({
  source,
  data: JSON.stringify(data),
  at: '2026-11-29T12:00:00.000Z',
})

describe('webhook messages of an outbox row', () => {
  it('sends a node loss as a status change and as session.node_lost, with the same data', () => {
    const data = { sessionId: 'ses_x', from: 'active', to: 'idle', cause: 'node_lost', detail: 'node rt_a' }
    expect(messagesOf(row('session_event', data))).toEqual([
      { type: 'session.status_changed', timestamp: '2026-11-29T12:00:00.000Z', data },
      { type: 'session.node_lost', timestamp: '2026-11-29T12:00:00.000Z', data },
    ])
  })

  it("names a turn's end by its status: interrupted is a failure, cancelled its own", () => {
    const types = ['completed', 'failed', 'interrupted', 'cancelled'].map(
      (status) => messagesOf(row('turn', { status }))[0]?.type,
    )
    expect(types).toEqual(['turn.completed', 'turn.failed', 'turn.failed', 'turn.cancelled'])
    expect(messagesOf(row('something_newer', {}))).toEqual([])
  })

  it("names an approval's request, its answer and its expiry", () => {
    expect(messagesOf(row('approval', { status: 'pending' }))[0]?.type).toBe('approval.requested')
    const types = ['approved', 'denied', 'expired'].map(
      (status) => messagesOf(row('approval_answer', { status }))[0]?.type,
    )
    expect(types).toEqual(['approval.answered', 'approval.answered', 'approval.expired'])
  })

  it('waits 4 times longer before each retry, at most 6 hours', () => {
    expect([1, 2, 3, 4, 7, 20].map((attempt) => retryDelayMs(attempt, 5000))).toEqual([
      5000,
      20_000,
      80_000,
      320_000,
      20_480_000,
      6 * 3600 * 1000,
    ])
  })
})
