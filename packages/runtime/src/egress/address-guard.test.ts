import os from 'node:os'
import { describe, expect, it } from 'vitest'
import { canonicalAddress, forbiddenReason, hostAddresses } from './address-guard.js'

// Every spelling of a loopback or unspecified address: each reaches the host itself.
const LOOPBACK_SPELLINGS = [
  '127.0.0.1',
  '127.1',
  '127.0.1',
  '0x7f.1',
  '0X7F.0.0.1',
  '0x7f000001',
  '2130706433',
  '017700000001',
  '0177.0.0.1',
  '127.000.000.001',
  '127.255.255.254',
  '0',
  '0.0.0.0',
  '::1',
  '[::1]',
  '::0:1',
  '0:0:0:0:0:0:0:1',
  '0000:0000:0000:0000:0000:0000:0000:0001',
  '::',
  '::ffff:127.0.0.1',
  '::FFFF:127.0.0.1',
  '0:0:0:0:0:ffff:127.0.0.1',
  '::127.0.0.1',
  '0::ffff:7f00:1',
  '::ffff:7f00:1',
  '::ffff:0.0.0.0',
  '::ffff:0:7f00:1',
  '::7f00:1',
  '::0.0.0.1',
]

// Private, link-local (metadata), shared, reserved and multicast, directly or embedded in IPv6.
const PRIVATE_SPELLINGS = [
  '10.0.0.1',
  '012.0.0.1',
  '0xa.1',
  '167772161',
  '172.16.0.1',
  '192.168.1.1',
  '100.64.0.1',
  '169.254.169.254',
  '0xa9fea9fe',
  '2852039166',
  '::ffff:169.254.169.254',
  '::ffff:a9fe:a9fe',
  '192.0.0.1',
  '198.18.0.1',
  '224.0.0.1',
  '255.255.255.255',
  '240.0.0.1',
  'fd00::1',
  'fc00::1',
  'FE80::1',
  'fe80::1%eth0',
  'fec0::1',
  'ff02::1',
  '2001:db8::1',
  '100::1',
  '64:ff9b::a9fe:a9fe',
  '64:ff9b::127.0.0.1',
  '64:ff9b::10.0.0.1',
  '64:ff9b:1::a00:1',
  '2002:7f00:1::',
  '2002:a9fe:a9fe::1',
  '2002:c0a8:101::1',
  // Teredo: server 65.54.227.120 with client 127.0.0.1 (inverted), and server 10.0.0.1.
  '2001:0:4136:e378:8000:63bf:80ff:fffe',
  '2001:0:a00:1:8000:63bf:3fff:fdd2',
  '1::8.8.8.8',
]

// The documentation ranges count as the outside world (sealed networks route them so, this CI's
// package registry among them); a host's own address in them is refused by the interface check.
const PUBLIC = [
  '8.8.8.8',
  '203.0.113.80',
  '198.51.100.1',
  '192.0.2.7',
  '::ffff:203.0.113.80',
  '93.184.215.14',
  '2606:4700:4700::1111',
  '64:ff9b::808:808',
  '2002:808:808::1',
]

describe('the egress address guard', () => {
  it('refuses every spelling of loopback and unspecified addresses', () => {
    for (const spelling of LOOPBACK_SPELLINGS)
      expect(forbiddenReason(spelling, new Set(), new Set()), spelling).toBeDefined()
  })

  it('refuses private, link-local, reserved and multicast addresses, also inside IPv6 forms', () => {
    for (const spelling of PRIVATE_SPELLINGS)
      expect(forbiddenReason(spelling, new Set(), new Set()), spelling).toBeDefined()
  })

  it('lets public unicast addresses through, also NAT64, 6to4 of public ones', () => {
    for (const address of PUBLIC)
      expect(forbiddenReason(address, new Set(), new Set()), address).toBeUndefined()
  })

  it("refuses the host's own addresses, read from its interfaces, and any spelling of them", () => {
    const own = Object.values(os.networkInterfaces())
      .flat()
      .map((info) => info?.address ?? '')
      .filter(Boolean)
    expect(own.length).toBeGreaterThan(0)
    for (const address of own) expect(forbiddenReason(address), address).toBeDefined()
    expect(hostAddresses()).toEqual(new Set(own.map((address) => canonicalAddress(address))))
    // A public address is refused once it is one of the host's.
    const ownPublic = new Set(['93.184.215.14', '2606:4700:4700::1111'])
    expect(forbiddenReason('93.184.215.14', new Set(), ownPublic)).toMatch(/address of this host/)
    expect(forbiddenReason('1572394766', new Set(), ownPublic)).toMatch(/address of this host/)
    expect(forbiddenReason('::ffff:5db8:d70e', new Set(), ownPublic)).toMatch(/address of this host/)
    expect(forbiddenReason('2606:4700:4700:0::1111', new Set(), ownPublic)).toMatch(/address of this host/)
    expect(forbiddenReason('64:ff9b::5db8:d70e', new Set(), ownPublic)).toMatch(/address of this host/)
    expect(forbiddenReason('192.0.2.2', new Set(), new Set(['192.0.2.2']))).toMatch(/address of this host/)
    expect(forbiddenReason('::ffff:c000:202', new Set(), new Set(['192.0.2.2']))).toMatch(
      /address of this host/,
    )
  })

  it("lets an operator's exception through, in any spelling", () => {
    expect(forbiddenReason('10.0.0.7', new Set(['10.0.0.7']), new Set())).toBeUndefined()
    expect(forbiddenReason('::ffff:a00:7', new Set(['10.0.0.7']), new Set())).toBeUndefined()
    expect(forbiddenReason('10.0.0.7', new Set(['0xa.7']), new Set())).toBeUndefined()
    expect(forbiddenReason('127.0.0.1', new Set(['127.0.0.1']))).toBeUndefined()
    expect(forbiddenReason('10.0.0.8', new Set(['10.0.0.7']), new Set())).toBeDefined()
  })

  it('reads one canonical form from every spelling, and no address from a name', () => {
    for (const spelling of [
      '127.1',
      '0x7f.1',
      '2130706433',
      '017700000001',
      '::ffff:127.0.0.1',
      '[::ffff:7f00:1]',
    ])
      expect(canonicalAddress(spelling), spelling).toBe('127.0.0.1')
    expect(canonicalAddress('::0:1')).toBe('::1')
    expect(canonicalAddress('0:0:0:0:0:0:0:1')).toBe('::1')
    for (const name of ['localhost', 'example.com', '1.2.3.4.5', '256.1.1.1', '08.1.1.1', '', 'fe80::1%'])
      expect(canonicalAddress(name), name).toBeUndefined()
    expect(forbiddenReason('example.com', new Set(), new Set())).toMatch(/not an IP address/)
  })
})
