import { describe, expect, it } from 'vitest'
import { checkCompatPrefix, egressHostMap, resolveConfig } from './config.js'

describe('egress hosts map (CAIRN_EGRESS_HOSTS)', () => {
  it('reads name=address pairs, case-insensitively, with several addresses per name', () => {
    const map = egressHostMap(' Api.Internal=10.1.2.3, api.internal=fd00::7 ,db=192.168.0.9,')
    expect(map.get('api.internal')).toEqual(['10.1.2.3', 'fd00::7'])
    expect(map.get('db')).toEqual(['192.168.0.9'])
    expect(egressHostMap(undefined).size).toBe(0)
    expect(egressHostMap({ 'x.test': '127.0.0.1' }).get('x.test')).toEqual(['127.0.0.1'])
  })

  it('refuses an entry that is not name=IP-address at start-up', () => {
    for (const bad of ['api.internal', '10.0.0.1', 'api.internal=not-an-ip', '=10.0.0.1', 'a=10.0.0.1=2'])
      expect(() => egressHostMap(bad), bad).toThrow(/CAIRN_EGRESS_HOSTS/)
  })
})

describe('build egress allowlist (CAIRN_BUILD_EGRESS_ALLOW)', () => {
  it("is the host's registries when unset, none when empty, and the listed hosts otherwise", () => {
    const saved = process.env.CAIRN_BUILD_EGRESS_ALLOW
    try {
      delete process.env.CAIRN_BUILD_EGRESS_ALLOW
      expect(resolveConfig({}).buildEgressAllow).toBeUndefined()
      process.env.CAIRN_BUILD_EGRESS_ALLOW = ''
      expect(resolveConfig({}).buildEgressAllow).toEqual([])
      process.env.CAIRN_BUILD_EGRESS_ALLOW = ' registry.internal:8443, pypi.org '
      expect(resolveConfig({}).buildEgressAllow).toEqual(['registry.internal:8443', 'pypi.org'])
      expect(resolveConfig({ buildEgressAllow: ['x.test'] }).buildEgressAllow).toEqual(['x.test'])
    } finally {
      if (saved === undefined) delete process.env.CAIRN_BUILD_EGRESS_ALLOW
      else process.env.CAIRN_BUILD_EGRESS_ALLOW = saved
    }
  })
})

describe('compat prefix (--compat-prefix, CAIRN_COMPAT_PREFIX)', () => {
  it('is off unless given, and a path of plain segments without its trailing slash when given', () => {
    expect(checkCompatPrefix(undefined)).toBeUndefined()
    expect(checkCompatPrefix('')).toBeUndefined()
    expect(checkCompatPrefix('/superserve/')).toBe('/superserve')
    expect(checkCompatPrefix('/a/b-c')).toBe('/a/b-c')
  })

  it("refuses what is not a path, the root, and Cairn's own /v1", () => {
    for (const bad of ['superserve', '/', '/v1', '/v1/x', '/a b', '/../x', '/a?x']) {
      expect(() => checkCompatPrefix(bad), bad).toThrow(/must be a path like \/superserve/)
    }
  })
})

describe('server role (--role, CAIRN_ROLE)', () => {
  it('is all unless api is asked for; anything else is refused, typed', () => {
    const saved = process.env.CAIRN_ROLE
    try {
      delete process.env.CAIRN_ROLE
      expect(resolveConfig({}).role).toBe('all')
      process.env.CAIRN_ROLE = 'api'
      expect(resolveConfig({}).role).toBe('api')
      expect(resolveConfig({ role: 'all' }).role).toBe('all')
      process.env.CAIRN_ROLE = 'node'
      expect(() => resolveConfig({})).toThrow(expect.objectContaining({ code: 'validation_failed' }))
    } finally {
      if (saved === undefined) delete process.env.CAIRN_ROLE
      else process.env.CAIRN_ROLE = saved
    }
  })
})
