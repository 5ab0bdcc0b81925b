import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { decodeJson, encodeJson } from './wire.js'

// The remote runtime port's JSON marks Buffers and Dates with keys of their own. An object of
// anyone else's that looked like a mark (an agent's tool input {"$cairn.bytes": "…"}, a
// transcript line's field) came out of the hop as a Buffer or a Date: what a turn's events and
// transcript hold must cross as they are, whatever their keys.
const MARK_KEYS = ['$cairn.bytes', '$cairn.date', '$cairn.object', '$cairn.bytes ', '$cairn']

/** JSON values, with objects of one key that is (or is near) a mark, at any depth. */
const values = fc.letrec((tie) => ({
  value: fc.oneof(
    { depthSize: 'small' },
    fc.jsonValue(),
    fc.array(tie('value'), { maxLength: 3 }),
    fc.dictionary(fc.string({ maxLength: 6 }), tie('value'), { maxKeys: 3 }),
    fc
      .tuple(
        fc.constantFrom(...MARK_KEYS),
        fc.oneof(fc.string(), fc.constant('2026-11-30T00:00:00.000Z'), tie('value')),
      )
      .map(([key, inner]) => ({ [key]: inner })),
  ),
})).value

describe('the remote port wire', () => {
  it('gives back every JSON value as it was, objects shaped like its marks included', () => {
    fc.assert(
      fc.property(values, (value) => {
        expect(decodeJson(encodeJson(value))).toStrictEqual(JSON.parse(JSON.stringify(value)))
      }),
      { numRuns: 500, seed: 7 },
    )
  })

  it('still carries Buffers and Dates, beside objects shaped like their marks', () => {
    const value = {
      bytes: Buffer.from([0, 1, 255]),
      at: new Date('2026-11-30T01:02:03.004Z'),
      input: { '$cairn.bytes': 'AAE=' },
      nested: [{ '$cairn.date': 'not a date' }, { '$cairn.object': ['$cairn.bytes', 'x'] }],
    }
    const back = decodeJson(encodeJson(value)) as typeof value
    expect(Buffer.isBuffer(back.bytes) && back.bytes.equals(value.bytes)).toBe(true)
    expect(back.at).toEqual(value.at)
    expect(back.input).toStrictEqual({ '$cairn.bytes': 'AAE=' })
    expect(back.nested).toStrictEqual(value.nested)
  })
})
