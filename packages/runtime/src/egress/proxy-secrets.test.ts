import { describe, expect, it } from 'vitest'
import { bindingAllowed } from './policy.js'
import {
  askPlainAnswer,
  FRAGMENT_BYTES,
  type ProxySecret,
  plainBody,
  SecretScrubber,
  scrubBytes,
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

  it('swaps stand-ins in credential headers only and names the secrets used', () => {
    const { headers, used } = swapInSecrets(
      {
        authorization: `Bearer ${TOKEN.standIn}`,
        'x-api-key': TOKEN.standIn,
        'Proxy-Authorization': `Basic ${OTHER.standIn}`,
        'x-custom': `a=${TOKEN.standIn};b=${OTHER.standIn}`,
        'set-cookie': [`t=${TOKEN.standIn}`],
        accept: '*/*',
      },
      [TOKEN, OTHER],
    )
    expect(headers).toEqual({
      authorization: 'Bearer real-token-1',
      'x-api-key': 'real-token-1',
      'Proxy-Authorization': 'Basic real-other-2',
      'x-custom': `a=${TOKEN.standIn};b=${OTHER.standIn}`,
      'set-cookie': [`t=${TOKEN.standIn}`],
      accept: '*/*',
    })
    expect(used.sort()).toEqual(['OTHER', 'TOKEN'])
  })

  it("swaps a stand-in into the extra headers its own secret declares, not another secret's", () => {
    const declared = { ...TOKEN, headers: ['x-token'] }
    const { headers, used } = swapInSecrets(
      { 'X-Token': `${TOKEN.standIn} ${OTHER.standIn}`, 'x-meta': TOKEN.standIn },
      [declared, OTHER],
    )
    expect(headers).toEqual({ 'X-Token': `real-token-1 ${OTHER.standIn}`, 'x-meta': TOKEN.standIn })
    expect(used).toEqual(['TOKEN'])
  })

  it('leaves headers alone when no secret is bound, and turns echoed values back', () => {
    const plain = { authorization: `Bearer ${TOKEN.standIn}` }
    expect(swapInSecrets(plain, []).headers).toEqual(plain)
    expect(swapOutSecrets({ 'x-echo': 'got real-token-1' }, [TOKEN])).toEqual({
      'x-echo': `got ${TOKEN.standIn}`,
    })
  })

  it('scrubs echoed values from a body wherever the chunks split it', async () => {
    const body = `{"error":"bad key real-token-1","again":"real-token-1","other":"real-other-2","x":"real-tok"}`
    const want = body
      .replaceAll('real-token-1', TOKEN.standIn)
      .replaceAll('real-other-2', OTHER.standIn)
      .replace('real-tok', '********')
    for (let cut = 0; cut <= body.length; cut++) {
      expect(await scrub([body.slice(0, cut), body.slice(cut)], [TOKEN, OTHER])).toBe(want)
    }
    expect(await scrub([...body], [TOKEN, OTHER])).toBe(want)
    expect(await scrub(['nothing to see'], [])).toBe('nothing to see')
  })

  it('masks every piece of a value of 8 bytes or more, wherever it is cut, and nothing shorter', async () => {
    const value = 'sk-0123456789abcdefghij'
    const secret: ProxySecret = { name: 'K', standIn: 'cairn-proxy-secret-k', value, hosts: ['x.test'] }
    const pieces = (text: string) =>
      [...Array(value.length - FRAGMENT_BYTES + 1).keys()]
        .map((at) => value.slice(at, at + FRAGMENT_BYTES))
        .filter((piece) => text.includes(piece))
    // Every slice of the value of 8 bytes or more, between ordinary text, in every 2-chunk cut.
    for (let start = 0; start + FRAGMENT_BYTES <= value.length; start += 3) {
      for (let end = start + FRAGMENT_BYTES; end <= value.length; end += 5) {
        const body = `head ${value.slice(start, end)} and ${value.slice(0, 7)} tail`
        for (let cut = 0; cut <= body.length; cut += 2) {
          const out = await scrub([body.slice(0, cut), body.slice(cut)], [secret])
          expect(pieces(out), `${body} cut at ${cut}`).toEqual([])
          // A piece keeps its length (masked); the whole value becomes the stand-in.
          if (end - start < value.length) expect(out.length).toBe(body.length)
          else expect(out).toContain(secret.standIn)
          // Text around the piece, and a piece of 7 bytes, are left alone.
          expect(out.startsWith('head ') && out.endsWith(` and ${value.slice(0, 7)} tail`)).toBe(true)
        }
      }
    }
    // Byte by byte, and pieces that overlap the stand-in of a whole value.
    const body = `${value.slice(2)}${value}${value.slice(0, 12)}`
    const out = await scrub([...body], [secret])
    expect(pieces(out)).toEqual([])
    expect(out).toContain(secret.standIn)
    expect(scrubBytes(Buffer.from(body), [secret]).toString()).toBe(out)
  })

  it('passes on at once what cannot begin a value or a piece of one (an SSE event), and holds the rest', async () => {
    const secret: ProxySecret = {
      name: 'K',
      standIn: 'cairn-proxy-secret-k',
      value: 'sk-0123456789',
      hosts: [],
    }
    const scrubber = new SecretScrubber([secret])
    const out: string[] = []
    scrubber.on('data', (chunk: Buffer) => out.push(chunk.toString()))
    const written = async (text: string) => {
      scrubber.write(Buffer.from(text))
      await new Promise((resolve) => setImmediate(resolve))
      return out.join('')
    }
    expect(await written('data: {"delta":"hi"}\n\n')).toBe('data: {"delta":"hi"}\n\n')
    // The start of the value, or of a piece of it, waits for what follows.
    expect(await written('event: x sk-01')).toBe('data: {"delta":"hi"}\n\nevent: x ')
    expect(await written('23456789 and 2345678')).toBe(
      `data: {"delta":"hi"}\n\nevent: x ${secret.standIn} and `,
    )
    expect(await written('9\n\n')).toBe(`data: {"delta":"hi"}\n\nevent: x ${secret.standIn} and ********\n\n`)
    scrubber.end()
  })

  it('scrubs the same however a body is cut, and leaves no 8 bytes of a value (random bodies)', async () => {
    const value = 'sk-aB3-aB3-xyz-0123'
    const secret: ProxySecret = { name: 'K', standIn: 'cairn-proxy-secret-k', value, hosts: [] }
    let seed = 7
    const random = (n: number) => {
      seed = (seed * 1103515245 + 12345) % 2 ** 31
      return seed % n
    }
    for (let round = 0; round < 300; round++) {
      let body = ''
      while (body.length < 80) {
        const start = random(value.length)
        body += random(2) ? value.slice(start, start + 1 + random(value.length)) : 'aB3-x0 '.slice(random(7))
      }
      const chunks: string[] = []
      for (let at = 0; at < body.length; ) {
        const size = 1 + random(12)
        chunks.push(body.slice(at, at + size))
        at += size
      }
      const out = await scrub(chunks, [secret])
      expect(out).toBe(scrubBytes(Buffer.from(body), [secret]).toString())
      for (let at = 0; at + FRAGMENT_BYTES <= value.length; at++)
        expect(out.includes(value.slice(at, at + FRAGMENT_BYTES)), body).toBe(false)
    }
  })

  it('masks pieces in header names and values, and keeps repeated headers', () => {
    const mixed: ProxySecret = { ...OTHER, value: 'Real-OTHER-2-Value' }
    expect(swapOutSecrets({ 'x-real-other-2-value': 'v', 'x-other-2-val': 'w' }, [mixed])).toEqual({
      [`x-${OTHER.standIn}`]: 'v',
      'x************': 'w',
    })
    const out = swapOutSecrets(
      {
        'x-a': 'Bearer real-tok',
        'x-b': 'en-1',
        'x-real-token-1': 'v',
        'set-cookie': ['a=real-token-1', 'b'],
      },
      [TOKEN],
    )
    expect(out).toEqual({
      'x-a': 'Bearer ********',
      'x-b': 'en-1',
      [`x-${TOKEN.standIn}`]: 'v',
      'set-cookie': [`a=${TOKEN.standIn}`, 'b'],
    })
  })

  it('reads answers as plain bytes, or refuses what could carry a piece past the scrubber', () => {
    expect(plainBody(200, {})).toEqual({ decoders: [] })
    expect(plainBody(200, { 'content-encoding': 'identity', 'transfer-encoding': 'chunked' })).toEqual({
      decoders: [],
    })
    const decoded = plainBody(200, { 'content-encoding': 'deflate, gzip' })
    expect('decoders' in decoded && decoded.decoders.length).toBe(2)
    expect(plainBody(200, { 'content-encoding': 'br' })).toHaveProperty('decoders')
    expect(plainBody(206, {})).toHaveProperty('refusal')
    expect(plainBody(200, { 'content-range': 'bytes 0-3/10' })).toHaveProperty('refusal')
    expect(plainBody(200, { 'content-encoding': 'zstd' })).toHaveProperty('refusal')
    expect(plainBody(200, { 'content-encoding': 'gzip, compress' })).toHaveProperty('refusal')
    expect(plainBody(200, { 'transfer-encoding': 'gzip, chunked' })).toHaveProperty('refusal')
    const headers: Record<string, string> = { range: 'bytes=0-3', 'if-range': 'x', te: 'gzip', accept: '*/*' }
    askPlainAnswer(headers)
    expect(headers).toEqual({ accept: '*/*', 'accept-encoding': 'identity' })
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
