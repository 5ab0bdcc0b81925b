import { describe, expect, it } from 'vitest'
import { MetricsRegistry } from './registry.js'

describe('MetricsRegistry', () => {
  it("keeps each server's figures apart (a registry per instance, not the global one)", async () => {
    const a = new MetricsRegistry()
    const b = new MetricsRegistry()
    a.turns.inc({ outcome: 'completed' })
    a.turns.inc({ outcome: 'completed' })
    a.turnSeconds.observe(0.2)
    b.turns.inc({ outcome: 'failed' })
    const textA = await a.render()
    const textB = await b.render()
    expect(textA).toMatch(/^cairn_turns_total\{outcome="completed"\} 2$/m)
    expect(textA).not.toContain('outcome="failed"')
    expect(textA).toMatch(/^cairn_turn_duration_seconds_bucket\{le="0.25"\} 1$/m)
    expect(textA).toMatch(/^cairn_turn_duration_seconds_bucket\{le="0.1"\} 0$/m)
    expect(textA).toMatch(/^cairn_turn_duration_seconds_count 1$/m)
    expect(textB).toMatch(/^cairn_turns_total\{outcome="failed"\} 1$/m)
    expect(a.contentType).toContain('text/plain; version=0.0.4')
  })

  it('reads gauges at scrape time, and drops label sets no longer read', async () => {
    const metrics = new MetricsRegistry()
    let statuses: Record<string, number> = { idle: 2, running: 1 }
    let free = 10
    metrics.gauge({
      name: 'test_sessions',
      help: 'by status',
      labelNames: ['status'],
      read: () => Object.entries(statuses).map(([status, value]) => ({ labels: { status }, value })),
    })
    metrics.gauge({ name: 'test_free_bytes', help: 'free', read: () => free })
    const first = await metrics.render()
    expect(first).toMatch(/^test_sessions\{status="idle"\} 2$/m)
    expect(first).toMatch(/^test_sessions\{status="running"\} 1$/m)
    expect(first).toMatch(/^test_free_bytes 10$/m)
    statuses = { idle: 3 }
    free = 4
    const second = await metrics.render()
    expect(second).toMatch(/^test_sessions\{status="idle"\} 3$/m)
    expect(second).not.toContain('status="running"')
    expect(second).toMatch(/^test_free_bytes 4$/m)
  })
})
