import { describe, expect, it } from 'vitest'
import { bindingAllowed } from './policy.js'
import {
  type ProxySecret,
  SecretScrubber,
  scrubbable,
  secretsBoundTo,
  swapInSecrets,
  swapOutSecrets,
} from './proxy-secrets.js'

async function scrub(chunks: string[], secrets: ProxySecret[]): Promise<string> {
  const scrubber = new SecretScrubber(secrets)
  const out: Buffer[] = []
  scrubber.on('data', (chunk: Buffer) => out.push(chunk))
  const ended = new Promise((resolve) => scrubber.on('end', resolve))
  for (const chunk of chunks) scrubber.write(Buffer.from(chunk))
  scrubber.end()
  await ended
  return Buffer.concat(out).toString()
}

const TOKEN: ProxySecret = {
  name: 'TOKEN',
  standIn: 'cairn-proxy-secret-aaaa',
  value: 'real-token-1',
  hosts: ['api.example.com', '*.internal.test:8443'],
}
const OTHER: ProxySecret = {
  name: 'OTHER',
  standIn: 'cairn-proxy-secret-bbbb',
  value: 'real-other-2',
  hosts: ['other.example.com'],
}

describe('proxy secrets', () => {
  it('binds a secret to its hosts by the allowlist rules', () => {
    expect(secretsBoundTo([TOKEN, OTHER], 'api.example.com', 443).map((s) => s.name)).toEqual(['TOKEN'])
    expect(secretsBoundTo([TOKEN, OTHER], 'API.example.com', 80).map((s) => s.name)).toEqual(['TOKEN'])
    expect(secretsBoundTo([TOKEN], 'api.example.com', 8443)).toEqual([])
    expect(secretsBoundTo([TOKEN], 'a.internal.test', 8443).map((s) => s.name)).toEqual(['TOKEN'])
    expect(secretsBoundTo([TOKEN], 'a.internal.test', 443)).toEqual([])
    expect(secretsBoundTo([TOKEN], 'api.example.com.evil.test', 443)).toEqual([])
  })

  it('swaps stand-ins in any request header and names the secrets used', () => {
    const { headers, used } = swapInSecrets(
      {
        authorization: `Bearer ${TOKEN.standIn}`,
        'x-api-key': TOKEN.standIn,
        'x-custom': `a=${TOKEN.standIn};b=${OTHER.standIn}`,
        'set-cookie': [`t=${TOKEN.standIn}`],
        accept: '*/*',
      },
      [TOKEN, OTHER],
    )
    expect(headers).toEqual({
      authorization: 'Bearer real-token-1',
      'x-api-key': 'real-token-1',
      'x-custom': 'a=real-token-1;b=real-other-2',
      'set-cookie': ['t=real-token-1'],
      accept: '*/*',
    })
    expect(used.sort()).toEqual(['OTHER', 'TOKEN'])
  })

  it('leaves headers alone when no secret is bound, and turns echoed values back', () => {
    const plain = { authorization: `Bearer ${TOKEN.standIn}` }
    expect(swapInSecrets(plain, []).headers).toEqual(plain)
    expect(swapOutSecrets({ 'x-echo': 'got real-token-1' }, [TOKEN])).toEqual({
      'x-echo': `got ${TOKEN.standIn}`,
    })
  })

  it('scrubs echoed values from a body wherever the chunks split it', async () => {
    const body = `{"error":"bad key real-token-1","again":"real-token-1","other":"real-other-2","x":"real-token"}`
    const want = body.replaceAll('real-token-1', TOKEN.standIn).replaceAll('real-other-2', OTHER.standIn)
    for (let cut = 0; cut <= body.length; cut++) {
      expect(await scrub([body.slice(0, cut), body.slice(cut)], [TOKEN, OTHER])).toBe(want)
    }
    expect(await scrub([...body], [TOKEN, OTHER])).toBe(want)
    expect(await scrub(['nothing to see'], [])).toBe('nothing to see')
    expect(scrubbable({})).toBe(true)
    expect(scrubbable({ 'content-encoding': 'gzip' })).toBe(false)
  })
})

describe('bindingAllowed', () => {
  const policy = { allow: ['api.example.com', { host: '*.example.org:8443', methods: ['GET'] }] }

  it('allows a binding the allowlist lets connections through to, by the proxy own rules', () => {
    expect(bindingAllowed(policy, 'api.example.com')).toBe(true)
    expect(bindingAllowed(policy, 'API.example.com:443')).toBe(true)
    expect(bindingAllowed(policy, 'a.b.example.org:8443')).toBe(true)
    // A wildcard binding with a host the allowlist names under it.
    expect(bindingAllowed(policy, '*.example.com')).toBe(true)
    expect(bindingAllowed(policy, '*.example.org:8443')).toBe(true)
  })

  it('refuses one whose host or port nothing allows', () => {
    expect(bindingAllowed(policy, 'other.example.com')).toBe(false)
    expect(bindingAllowed(policy, 'api.example.com:8443')).toBe(false)
    expect(bindingAllowed(policy, 'x.example.org')).toBe(false)
    expect(bindingAllowed(policy, '*.example.net')).toBe(false)
    expect(bindingAllowed({ allow: [] }, 'api.example.com')).toBe(false)
  })
})
