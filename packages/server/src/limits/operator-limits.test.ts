import { describe, expect, it } from 'vitest'
import { defaultOperatorLimits, resolveOperatorLimits } from './operator-limits.js'

describe("the operator's maxima", () => {
  it('takes the options, else the environment, else the defaults (the tenant rate defaults to the per-key rate)', () => {
    const env = { CAIRN_MAX_MEMORY_MIB: '2048', CAIRN_MAX_CPUS: '0.5', CAIRN_MAX_KEYS_PER_TENANT: '7' }
    const limits = resolveOperatorLimits({ maxMemoryMiB: 1024, maxPids: undefined }, 300, env)
    expect(limits).toEqual({
      ...defaultOperatorLimits(300),
      maxMemoryMiB: 1024,
      maxCpus: 0.5,
      maxKeysPerTenant: 7,
      tenantRateLimitPerSecond: 300,
    })
    expect(resolveOperatorLimits({}, 300, { CAIRN_TENANT_RATE_LIMIT: '0' }).tenantRateLimitPerSecond).toBe(0)
  })

  it('refuses a value that is not a positive number at start-up, naming the variable', () => {
    for (const [name, value] of [
      ['CAIRN_MAX_MEMORY_MIB', 'lots'],
      ['CAIRN_MAX_PIDS', '-1'],
      ['CAIRN_MAX_SANDBOXES_PER_TENANT', '0'],
      ['CAIRN_TENANT_RATE_LIMIT', 'Infinity'],
    ] as const)
      expect(() => resolveOperatorLimits({}, 1000, { [name]: value }), name).toThrow(name)
  })
})
