import { readFileSync } from 'node:fs'
import * as protocol from '@cairn/protocol'
import { Kind, type TSchema } from '@sinclair/typebox'
import { Value } from '@sinclair/typebox/value'
import { describe, expect, it } from 'vitest'
import { CHECKED, generateValidators, OUTPUT } from '../scripts/validators.js'
import { checked } from './guards.js'
import type { Validator } from './validator.js'
import * as valid from './validators.js'

type Schema = TSchema & Record<string, unknown>

/**
 * Values the schema accepts, one per choice of each union's member (`pick` picks the member, and the
 * optional properties are left out on odd picks): the kinds the response schemas use.
 */
function sample(s: Schema, pick: number): unknown {
  switch (s[Kind]) {
    case 'Object': {
      const out: Record<string, unknown> = {}
      const required = (s.required as string[] | undefined) ?? []
      for (const [key, p] of Object.entries(s.properties as Record<string, Schema>))
        if (required.includes(key) || pick % 2 === 0) out[key] = sample(p, pick)
      return out
    }
    case 'Intersect':
      return Object.assign({}, ...(s.allOf as Schema[]).map((m) => sample(m, pick)))
    case 'Union': {
      const members = s.anyOf as Schema[]
      return sample(members[pick % members.length] as Schema, Math.floor(pick / members.length))
    }
    case 'Array':
      return pick % 3 === 2 ? [] : [sample(s.items as Schema, pick)]
    case 'Record':
      return { key: sample(Object.values(s.patternProperties as Record<string, Schema>)[0] as Schema, pick) }
    case 'String':
      return 'x'.repeat(Math.max(1, (s.minLength as number | undefined) ?? 1))
    case 'Integer':
      return (s.minimum as number | undefined) ?? 0
    case 'Number':
      return ((s.minimum as number | undefined) ?? 0) + 0.5
    case 'Literal':
      return s.const
    case 'Boolean':
      return pick % 2 === 0
    case 'Null':
      return null
    case 'Unknown':
      return { any: 1 }
    default:
      throw new Error(`no sample for a ${String(s[Kind])} schema`)
  }
}

/** Samples per schema: each union member up to the fourth, optional properties there and not. */
const PICKS = 4

const WRONG: unknown[] = [null, 'x', '', 0, -1, 1.5, true, {}, [], ['x'], { extra: 1 }]

/** `value` with each of WRONG at each place in it, each property dropped, and one property added. */
function* mutants(value: unknown): Generator<unknown> {
  for (const wrong of WRONG) yield wrong
  if (Array.isArray(value))
    for (const [i, item] of value.entries())
      for (const m of mutants(item)) yield value.map((v, j) => (j === i ? m : v))
  else if (typeof value === 'object' && value !== null) {
    yield { ...value, fieldFromANewerServer: 1 }
    for (const [key, v] of Object.entries(value)) {
      const { [key]: _dropped, ...rest } = value as Record<string, unknown>
      yield rest
      for (const m of mutants(v)) yield { ...value, [key]: m }
    }
  }
}

/** What the SDK said before its checks were generated: TypeBox's interpreter on the schema. */
function interpreted(schema: TSchema, value: unknown, what: string): string | undefined {
  if (Value.Check(schema, value)) return undefined
  const first = Value.Errors(schema, value).First()
  const where = first ? `: ${first.path || '/'} ${first.message}` : ''
  return `the server sent an unexpected ${what}${where}`
}

function generated(validator: Validator<unknown>, value: unknown, what: string): string | undefined {
  try {
    checked(validator, value, what)
    return undefined
  } catch (error) {
    return (error as Error).message
  }
}

describe('generated response validators', () => {
  it('are what scripts/validators.ts writes from the protocol schemas (run it after changing one)', () => {
    expect(readFileSync(OUTPUT, 'utf8')).toBe(generateValidators())
  })

  it('accept and refuse what TypeBox’s interpreter does on the protocol schema, naming the same mismatch', () => {
    let compared = 0
    let refused = 0
    const differences: string[] = []
    for (const exported of CHECKED) {
      const name = exported.replace(/Schema$/, '')
      const schema = (protocol as Record<string, TSchema>)[exported] as TSchema
      const validator = (valid as Record<string, Validator<unknown>>)[name] as Validator<unknown>
      for (let pick = 0; pick < PICKS; pick++) {
        const good = sample(schema as Schema, pick)
        expect(Value.Check(schema, good), `${name} sample ${pick}`).toBe(true)
        for (const value of [good, ...mutants(good)]) {
          const before = interpreted(schema, value, name)
          const now = generated(validator, value, name)
          if (now !== before) differences.push(`${JSON.stringify(value)}: ${now} (was ${before})`)
          compared++
          if (before !== undefined) refused++
        }
      }
    }
    expect(differences).toEqual([])
    // Most mutants are refused (a wrong type somewhere), some pass (a wrong value where any is fine).
    expect(refused).toBeGreaterThan(compared / 2)
    expect(compared - refused).toBeGreaterThan(CHECKED.length * PICKS)
  })
})
