import { readFileSync } from 'node:fs'
import { CairnProblem } from '@cairn/protocol'
import { describe, expect, it } from 'vitest'
import { chainKey, parseChainLink, parseTreeManifest, seqOfKey } from './chain-link.js'

const fixture = (name: string) => readFileSync(new URL(`./fixtures/${name}`, import.meta.url))
const SESSION = 'ses_0a1b2c3d4e5f6g7h8j9k'

function refusal(parse: () => unknown): CairnProblem {
  try {
    parse()
  } catch (error) {
    expect(error).toBeInstanceOf(CairnProblem)
    expect((error as CairnProblem).code).toBe('chain_invalid')
    return error as CairnProblem
  }
  throw new Error('expected a refusal')
}

/** The fixture as an object, changed by `edit`, as bytes again. */
function edited(edit: (link: Record<string, unknown>) => void): Buffer {
  const link = JSON.parse(fixture('chain-link-v1.json').toString('utf8')) as Record<string, unknown>
  edit(link)
  return Buffer.from(JSON.stringify(link))
}

describe('chain link format', () => {
  it('reads the version 1 fixture (a manifest written by the first release of the format)', () => {
    const link = parseChainLink(fixture('chain-link-v1.json'), SESSION, 3)
    expect(link).toMatchObject({ version: 1, seq: 3, baseSeq: 1, kind: 'increment', generation: 7 })
    expect(link.stream.parts.map((part) => part.bytes)).toEqual([1048576, 524288])
  })

  it('reads the version 1 tree manifest fixture', () => {
    const tree = parseTreeManifest(fixture('tree-v1.json'), 'revision', 'rev_0a1b2c3d4e5f6g7h8j9k')
    expect(tree.stream.format).toBe('tar')
  })

  it('refuses a link that is not the one asked for, or says what it cannot be', () => {
    expect(refusal(() => parseChainLink(fixture('chain-link-v1.json'), 'ses_other', 3)).message).toMatch(
      /names session/,
    )
    expect(refusal(() => parseChainLink(fixture('chain-link-v1.json'), SESSION, 4)).message).toMatch(/link 3/)
    const fullWithParent = edited((link) => {
      link.kind = 'full'
    })
    expect(refusal(() => parseChainLink(fullWithParent, SESSION, 3)).message).toMatch(
      /full link has no parent/,
    )
    const shortParts = edited((link) => {
      ;(link.stream as { bytes: number }).bytes = 5
    })
    expect(refusal(() => parseChainLink(shortParts, SESSION, 3)).message).toMatch(/parts hold 1572864 bytes/)
    const extra = edited((link) => {
      link.note = 'unexpected'
    })
    expect(refusal(() => parseChainLink(extra, SESSION, 3)).message).toMatch(/not a valid shipped manifest/)
    expect(refusal(() => parseChainLink(Buffer.from('null'), SESSION, 3)).message).toMatch(/unknown version/)
  })

  it('names links so the store lists them in order, and reads only its own names back', () => {
    expect(chainKey(SESSION, 12)).toBe(`sessions/${SESSION}/chain/0000000012.json`)
    expect(seqOfKey(SESSION, chainKey(SESSION, 12))).toBe(12)
    expect(seqOfKey(SESSION, `sessions/${SESSION}/chain/12.json`)).toBeUndefined()
    expect(seqOfKey(SESSION, `sessions/${SESSION}/chain/0000000012.json.tmp`)).toBeUndefined()
  })
})
