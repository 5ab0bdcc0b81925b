import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { MIN_REDACTED_LENGTH, Redactor } from './redaction.js'

const NAME = 'TOKEN'
const MARKER = `[redacted:${NAME}]`

/** Bytes that make encodings differ from the value (`/`, `+`, `%`, `&`, spaces, quotes, accents). */
const valueArb = fc
  .string({
    unit: fc.constantFrom(...'aZ09/+=%&?# "\\é€😀-_.~:@\n'.split(/(?:)/u)),
    minLength: MIN_REDACTED_LENGTH,
    maxLength: 24,
  })
  .filter((value) => value.length >= MIN_REDACTED_LENGTH)
const textArb = fc.string({ unit: 'grapheme-ascii', maxLength: 12 })
const bytesArb = fc.uint8Array({ maxLength: 5 }).map((bytes) => Buffer.from(bytes))

/** The characters of base64(prefix + value), at prefix's alignment, that only the value fixes. */
function base64Of(value: Buffer, prefix: Buffer, suffix: Buffer, url: boolean) {
  const all = Buffer.concat([prefix, value, suffix]).toString(url ? 'base64url' : 'base64')
  const first = Math.ceil((prefix.length * 8) / 6)
  const end = Math.floor(((prefix.length + value.length) * 8) / 6)
  return { printed: all, core: all.slice(first, end) }
}

/** One way a program prints a value: what it prints, and what must never be shown of it. */
interface Printed {
  printed: string
  secret: string
}

const lowerHex = (text: string) => text.replace(/%[0-9A-F]{2}/g, (digits) => digits.toLowerCase())

/** Every encoding the redactor claims to catch. */
const encodings: Record<string, (value: string, prefix: Buffer, suffix: Buffer) => Printed> = {
  raw: (value) => ({ printed: value, secret: value }),
  json: (value) => ({ printed: JSON.stringify({ v: value }), secret: JSON.stringify(value).slice(1, -1) }),
  // Python's json.dumps (ensure_ascii): every code unit past ASCII as a lowercase \\uXXXX escape.
  jsonAscii: (value) => {
    const escaped = JSON.stringify(value)
      .slice(1, -1)
      .split('')
      .map((unit) =>
        unit.charCodeAt(0) > 0x7f ? `\\u${unit.charCodeAt(0).toString(16).padStart(4, '0')}` : unit,
      )
      .join('')
    return { printed: `{"v": "${escaped}"}`, secret: escaped }
  },
  uriComponent: (value) => ({
    printed: `https://u:${encodeURIComponent(value)}@h/`,
    secret: encodeURIComponent(value),
  }),
  uriComponentLower: (value) => ({
    printed: lowerHex(encodeURIComponent(value)),
    secret: lowerHex(encodeURIComponent(value)),
  }),
  uri: (value) => ({ printed: encodeURI(value), secret: encodeURI(value) }),
  form: (value) => {
    const form = new URLSearchParams({ t: value }).toString()
    return { printed: `a=1&${form}`, secret: form.slice(2) }
  },
  hex: (value) => ({
    printed: Buffer.from(value).toString('hex'),
    secret: Buffer.from(value).toString('hex'),
  }),
  hexUpper: (value) => {
    const hex = Buffer.from(value).toString('hex').toUpperCase()
    return { printed: hex, secret: hex }
  },
  base64: (value, prefix, suffix) => {
    const { printed, core } = base64Of(Buffer.from(value), prefix, suffix, false)
    return { printed, secret: core }
  },
  base64url: (value, prefix, suffix) => {
    const { printed, core } = base64Of(Buffer.from(value), prefix, suffix, true)
    return { printed, secret: core }
  },
}

/** Whether `shown` still holds `secret` outside the markers. */
const leaks = (shown: string, secret: string) => shown.split(MARKER).join('\u0000').includes(secret)

describe('Redactor', () => {
  it('removes every encoding of a value from a text, whole or written in two chunks split anywhere', () => {
    fc.assert(
      fc.property(
        valueArb,
        fc.constantFrom(...Object.keys(encodings)),
        textArb,
        textArb,
        bytesArb,
        bytesArb,
        (value, encoding, before, after, prefix, suffix) => {
          const redactor = new Redactor({ [NAME]: value })
          const { printed, secret } = (encodings[encoding] as (typeof encodings)['raw'])(
            value,
            prefix,
            suffix,
          )
          const text = `${before}${printed}${after}`
          const whole = redactor.redact(text)
          expect(leaks(whole, secret), whole).toBe(false)
          expect(whole).toContain(MARKER)
          for (let split = 0; split <= text.length; split++) {
            const stream = redactor.stream()
            const shown = stream.write(text.slice(0, split)) + stream.write(text.slice(split)) + stream.end()
            expect(shown).toBe(whole)
          }
        },
      ),
      { numRuns: 300 },
    )
  })

  it('gives the same text however it is cut into chunks, with several values', () => {
    fc.assert(
      fc.property(
        fc.array(valueArb, { minLength: 1, maxLength: 3 }),
        fc.array(fc.oneof(textArb, valueArb), { maxLength: 8 }),
        fc.array(fc.nat(), { maxLength: 6 }),
        (values, parts, cuts) => {
          const redactor = new Redactor(Object.fromEntries(values.map((v, i) => [`S${i}`, v])))
          const text = parts.join('')
          const points = [...new Set(cuts.map((cut) => cut % (text.length + 1)))].sort((a, b) => a - b)
          const stream = redactor.stream()
          let shown = ''
          let last = 0
          for (const point of [...points, text.length]) {
            shown += stream.write(text.slice(last, point))
            last = point
          }
          expect(shown + stream.end()).toBe(redactor.redact(text))
        },
      ),
      { numRuns: 300 },
    )
  })

  it('leaves text without any form of a value unchanged, streamed or not', () => {
    fc.assert(
      fc.property(textArb, fc.string({ unit: 'grapheme-ascii', maxLength: 40 }), (value, text) => {
        fc.pre(value.length >= MIN_REDACTED_LENGTH && !text.includes(value))
        const redactor = new Redactor({ [NAME]: value })
        fc.pre(!redactor.redact(text).includes(MARKER))
        const stream = redactor.stream()
        expect(stream.write(text) + stream.end()).toBe(text)
      }),
    )
  })

  it(`does not redact values under ${MIN_REDACTED_LENGTH} characters`, () => {
    const redactor = new Redactor({ PIN: '42', A: 'abc' })
    expect(redactor.redact('PIN 42, abc, YWJj')).toBe('PIN 42, abc, YWJj')
  })

  it('finds each line of a value of several lines on its own, for logs kept line by line', () => {
    const key = '-----BEGIN KEY-----\nMIIBOgIBAAJBAKj34GkxFhD9\n-----END KEY-----'
    const redactor = new Redactor({ KEY: key })
    expect(redactor.redact('MIIBOgIBAAJBAKj34GkxFhD9')).toBe('[redacted:KEY]')
    expect(redactor.redact(`x${key}y`)).toBe('x[redacted:KEY]y')
  })

  it('takes a value that is not well-formed UTF-16 without throwing', () => {
    const redactor = new Redactor({ ODD: 'ab\ud800cd' })
    expect(redactor.redact('xab\ud800cdx')).toBe(`x[redacted:ODD]x`)
  })
})
