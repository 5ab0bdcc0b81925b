import { describe, expect, it } from 'vitest'
import { NoNodeAvailable, type PlacementNode, type PlacementRequest, placeSession } from './placement.js'

const NOW = 1_700_000_000_000
const GiB = 1024 ** 3

/** A seeded random source (mulberry32), so a failing spread can be replayed. */
function seeded(seed: number): () => number {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

function node(id: string, over: Partial<PlacementNode> = {}): PlacementNode {
  return {
    id,
    state: 'ready',
    drivers: ['bwrap'],
    cpus: 4,
    warmSandboxes: 0,
    poolFreeBytes: 8 * GiB,
    poolSizeBytes: 10 * GiB,
    leaseExpiresAtMs: NOW + 5000,
    ...over,
  }
}

function request(over: Partial<PlacementRequest> = {}): PlacementRequest {
  return { driver: 'bwrap', revisionHolders: new Set(), minFreeBytes: 64 * 1024 * 1024, nowMs: NOW, ...over }
}

/** Places `count` sessions, each one counted on its node as the routing port counts them. */
function spread(nodes: PlacementNode[], count: number, req: PlacementRequest, random: () => number) {
  const placed = new Map(nodes.map((n) => [n.id, 0]))
  for (let i = 0; i < count; i++) {
    const id = placeSession(nodes, req, random)
    placed.set(id, (placed.get(id) ?? 0) + 1)
    const chosen = nodes.find((n) => n.id === id) as PlacementNode
    chosen.placedSinceHeartbeat = (chosen.placedSinceHeartbeat ?? 0) + 1
  }
  return placed
}

describe('placeSession', () => {
  it('spreads 300 sessions over 3 nodes within ±20 % of even, for every seed tried', () => {
    for (let seed = 1; seed <= 50; seed++) {
      const nodes = [node('rt_a'), node('rt_b'), node('rt_c')]
      const placed = spread(nodes, 300, request(), seeded(seed))
      for (const count of placed.values()) {
        expect(count).toBeGreaterThanOrEqual(80)
        expect(count).toBeLessThanOrEqual(120)
      }
    }
  })

  it('still spreads when one node holds the revision, which it gets a few more of', () => {
    const nodes = [node('rt_a'), node('rt_b'), node('rt_c')]
    const placed = spread(nodes, 300, request({ revisionHolders: new Set(['rt_b']) }), seeded(7))
    for (const count of placed.values()) {
      expect(count).toBeGreaterThanOrEqual(80)
      expect(count).toBeLessThanOrEqual(120)
    }
    expect(placed.get('rt_b')).toBeGreaterThan(placed.get('rt_a') as number)
  })

  it('prefers the node that holds the revision when the load is even', () => {
    const nodes = [node('rt_a'), node('rt_b')]
    for (let seed = 1; seed <= 20; seed++)
      expect(placeSession(nodes, request({ revisionHolders: new Set(['rt_b']) }), seeded(seed))).toBe('rt_b')
  })

  it('weighs warm sandboxes per CPU and pool use', () => {
    // 6 warm sandboxes on 8 CPUs beat 4 on 2; a nearly full pool loses to an empty one.
    expect(
      placeSession(
        [node('rt_a', { warmSandboxes: 4, cpus: 2 }), node('rt_b', { warmSandboxes: 6, cpus: 8 })],
        request(),
        seeded(1),
      ),
    ).toBe('rt_b')
    expect(
      placeSession(
        [node('rt_a', { poolFreeBytes: 1 * GiB }), node('rt_b', { poolFreeBytes: 9 * GiB })],
        request(),
        seeded(2),
      ),
    ).toBe('rt_b')
  })

  it('takes only ready nodes with a live lease, the driver and pool space, and says why of the rest', () => {
    const nodes = [
      node('rt_cordoned', { state: 'cordoned' }),
      node('rt_draining', { state: 'draining' }),
      node('rt_lost', { state: 'lost' }),
      node('rt_expired', { leaseExpiresAtMs: NOW - 1 }),
      node('rt_nogvisor', { drivers: ['bwrap'] }),
      node('rt_full', { drivers: ['bwrap', 'gvisor'], poolFreeBytes: 1024 }),
      node('rt_ok', { drivers: ['bwrap', 'gvisor'] }),
    ]
    for (let seed = 1; seed <= 30; seed++)
      expect(placeSession(nodes, request({ driver: 'gvisor' }), seeded(seed))).toBe('rt_ok')
    const without = nodes.filter((n) => n.id !== 'rt_ok')
    let refused: unknown
    try {
      placeSession(without, request({ driver: 'gvisor' }), seeded(1))
    } catch (error) {
      refused = error
    }
    expect(refused).toBeInstanceOf(NoNodeAvailable)
    expect((refused as NoNodeAvailable).reasons).toEqual({
      rt_cordoned: 'is cordoned',
      rt_draining: 'is draining',
      rt_lost: 'is lost',
      rt_expired: 'has no live lease',
      rt_nogvisor: 'has no gvisor driver',
      rt_full: 'has 1024 bytes free in its pool (67108864 needed)',
    })
    expect(() => placeSession([], request(), seeded(1))).toThrow('no runtime node is registered')
  })

  it('a pool of unknown size counts as not used, and a node with no CPUs counted as one', () => {
    expect(
      placeSession(
        [
          node('rt_a', { poolFreeBytes: null, poolSizeBytes: null, warmSandboxes: 1 }),
          node('rt_b', { cpus: 0, warmSandboxes: 2 }),
        ],
        request(),
        seeded(3),
      ),
    ).toBe('rt_a')
  })
})
