import dgram from 'node:dgram'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { egressName, LookupError, NameResolver, parseHostsFile } from './names.js'

describe('egress names', () => {
  it('spells a name one way: lowercase, no trailing dots, no brackets', () => {
    expect(egressName('Svc.Internal.')).toBe('svc.internal')
    expect(egressName('svc.internal..')).toBe('svc.internal')
    expect(egressName('[2001:DB8::1]')).toBe('2001:db8::1')
  })

  it('reads a hosts file as every name and alias of each line', () => {
    const names = parseHostsFile(
      '# comment\n127.0.0.1 localhost Local.Alias. # trailing\n::1 localhost\nbad line\n',
    )
    expect(names.get('localhost')).toEqual(['127.0.0.1', '::1'])
    expect(names.get('local.alias')).toEqual(['127.0.0.1'])
    expect(names.has('bad')).toBe(false)
  })
})

describe('a sandbox name resolver', () => {
  // A DNS server that never answers, and remembers what it was asked.
  let silent: dgram.Socket
  let server = ''
  const asked = new Set<string>()

  beforeAll(async () => {
    silent = dgram.createSocket('udp4')
    silent.on('message', (query) => asked.add(query.toString('latin1', 13, 13 + (query[12] ?? 0))))
    await new Promise<void>((resolve) => silent.bind(0, '127.0.0.1', resolve))
    server = `127.0.0.1:${silent.address().port}`
  })

  afterAll(() => silent.close())

  it("answers from the operator's map (its names spelled the one way) and /etc/hosts before DNS", async () => {
    const resolver = new NameResolver(new Map([['Svc.Internal.', ['10.1.2.3']]]), {
      maxLookups: 1,
      lookupTimeoutMs: 200,
      dnsServers: [server],
    })
    expect(await resolver.addresses('svc.internal')).toEqual(['10.1.2.3'])
    expect(await resolver.addresses('localhost')).toContain('127.0.0.1')
    resolver.close()
  })

  it('gives up on a name DNS never answers within its timeout, and has no more than its cap out at once', async () => {
    asked.clear()
    const resolver = new NameResolver(undefined, {
      maxLookups: 2,
      lookupTimeoutMs: 1500,
      dnsServers: [server],
    })
    const settled = Promise.allSettled(
      ['slow1.t', 'slow2.t', 'slow3.t', 'slow4.t'].map((name) => resolver.addresses(name)),
    )
    // While the first two wait on DNS (its first try alone is 500 ms), the others wait for a slot.
    await new Promise((r) => setTimeout(r, 200))
    expect([...asked].sort()).toEqual(['slow1', 'slow2'])
    const outcomes = await settled
    for (const outcome of outcomes) {
      expect(outcome.status).toBe('rejected')
      expect((outcome as PromiseRejectedResult).reason).toBeInstanceOf(LookupError)
    }
    expect(String((outcomes[0] as PromiseRejectedResult).reason)).toMatch(
      /no answer for slow1.t within 1500 ms/,
    )
    resolver.close()
  })
})
