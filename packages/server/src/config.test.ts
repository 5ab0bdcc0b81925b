import { describe, expect, it } from 'vitest'
import { egressHostMap } from './config.js'

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
