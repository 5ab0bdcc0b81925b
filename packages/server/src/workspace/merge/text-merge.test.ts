import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { mergeText, splitLines, textOf } from './text-merge.js'

const labels = { ours: 'target', base: 'base', theirs: 'fork' }

/** Replaces lines [start, end) of `lines` with `insert`. */
function edit(lines: string[], start: number, end: number, insert: string[]): string[] {
  return [...lines.slice(0, start), ...insert, ...lines.slice(end)]
}

describe('mergeText', () => {
  it('keeps line ends, a last line without one included', () => {
    expect(splitLines('a\nb')).toEqual(['a\n', 'b'])
    expect(splitLines('a\n\n')).toEqual(['a\n', '\n'])
    expect(textOf(Buffer.from([0x61, 0, 0x62]))).toBeUndefined()
    expect(textOf(Buffer.from([0xff, 0xfe]))).toBeUndefined()
  })

  it('merges changes to different lines and marks changes to the same line', () => {
    const base = 'one\ntwo\nthree\nfour\n'
    expect(mergeText('ONE\ntwo\nthree\nfour\n', base, 'one\ntwo\nthree\nFOUR\n', labels)).toEqual({
      clean: true,
      text: 'ONE\ntwo\nthree\nFOUR\n',
    })
    const same = mergeText('one\nTWO\nthree\nfour\n', base, 'one\n2\nthree\nfour\n', labels)
    expect(same).toEqual({
      clean: false,
      conflicts: 1,
      text: 'one\n<<<<<<< target\nTWO\n||||||| base\ntwo\n=======\n2\n>>>>>>> fork\nthree\nfour\n',
    })
    // The same change on both sides is no conflict.
    expect(mergeText('one\nX\nthree\nfour\n', base, 'one\nX\nthree\nfour\n', labels)).toMatchObject({
      clean: true,
      text: 'one\nX\nthree\nfour\n',
    })
  })

  it('equals applying both edits when they touch disjoint line ranges (property)', () => {
    // Base lines are distinct and edits bring new distinct lines, so the line diff has one answer.
    const scenario = fc
      .record({
        size: fc.integer({ min: 3, max: 60 }),
        cuts: fc.array(fc.nat(), { minLength: 4, maxLength: 4 }),
        ours: fc.array(fc.nat(3), { maxLength: 4 }),
        theirs: fc.array(fc.nat(3), { maxLength: 4 }),
        lastNewline: fc.boolean(),
      })
      .map(({ size, cuts, ours, theirs, lastNewline }) => {
        // Two ranges [a, b) and [c, d) with at least one untouched line between them.
        const [a, b, c, d] = cuts.map((n) => n % (size + 1)).sort((x, y) => x - y) as [
          number,
          number,
          number,
          number,
        ]
        return { size, a, b, c: Math.max(c, b + 1), d: Math.max(d, b + 1), ours, theirs, lastNewline }
      })
      // An insertion after a last line without a line end would extend that line, not add one.
      .filter(({ size, c, d, lastNewline }) => c <= size && d <= size && (lastNewline || c < size))
    fc.assert(
      fc.property(scenario, fc.boolean(), ({ size, a, b, c, d, ours, theirs, lastNewline }, swap) => {
        const base = Array.from({ length: size }, (_, i) => `line ${i}\n`)
        if (!lastNewline) base[size - 1] = `line ${size - 1}`
        const first = ours.map((n, i) => `ours ${i}.${n}\n`)
        const second = theirs.map((n, i) => `theirs ${i}.${n}\n`)
        const both = edit(edit(base, c, d, second), a, b, first)
        const mine = edit(base, a, b, first)
        const other = edit(base, c, d, second)
        const [x, y] = swap ? [other, mine] : [mine, other]
        const merged = mergeText(x.join(''), base.join(''), y.join(''), labels)
        expect(merged).toEqual({ clean: true, text: both.join('') })
      }),
      { numRuns: 300 },
    )
  })
})
