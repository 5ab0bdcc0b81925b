import { writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { connectionCeiling, descriptorLimit, peerKey } from './admission.js'

describe('connection admission', () => {
  it('counts an IPv4 peer by its address (also IPv4-mapped) and an IPv6 peer by its /64', () => {
    expect(peerKey('127.0.0.2')).toBe('127.0.0.2')
    expect(peerKey('::ffff:10.1.2.3')).toBe('10.1.2.3')
    expect(peerKey('2001:db8:0:1::5')).toBe(peerKey('2001:db8:0:1:ffff:1:2:3'))
    expect(peerKey('2001:db8:0:1::5')).not.toBe(peerKey('2001:db8:0:2::5'))
    expect(peerKey('::1')).toBe('0:0:0:0::/64')
  })

  it('reads the descriptor limit and leaves the runtime a quarter of it, at least 256', () => {
    const file = path.join(os.tmpdir(), `limits-${process.pid}`)
    writeFileSync(
      file,
      'Limit  Soft Limit  Hard Limit  Units\nMax open files            1024                 4096                 files\n',
    )
    expect(descriptorLimit(file)).toBe(1024)
    expect(connectionCeiling(1024)).toBe(768)
    expect(connectionCeiling(20_000)).toBe(15_000)
    expect(connectionCeiling(undefined)).toBe(10_000)
  })
})
