import { describe, expect, it } from 'vitest'
import { MARK_END, MARK_START, type MarkerChunk, StdioMarkerParser } from './stdio-marker.js'

const NONCE = '0123456789abcdef'
const mark = (count: number, nonce = NONCE) => `${MARK_START}${nonce}:${count}${MARK_END}`

/** Feeds every chunk and merges adjacent text pieces, so assertions do not depend on chunking. */
function feed(chunks: string[], nonce = NONCE): MarkerChunk[] {
  const parser = new StdioMarkerParser(nonce)
  const out: MarkerChunk[] = []
  for (const chunk of chunks) {
    for (const piece of parser.push(chunk)) {
      const last = out.at(-1)
      if (last && last.marker === undefined) {
        last.text += piece.text
        if (piece.marker !== undefined) last.marker = piece.marker
      } else {
        out.push({ ...piece })
      }
    }
  }
  const rest = parser.flush()
  if (rest) out.push({ text: rest })
  return out
}

describe('StdioMarkerParser', () => {
  it('splits text before and after a marker', () => {
    const parser = new StdioMarkerParser(NONCE)
    expect(parser.push(`hello\n${mark(1)}after`)).toEqual([{ text: 'hello\n', marker: 1 }, { text: 'after' }])
    expect(parser.flush()).toBe('')
  })

  it('reports a marker with no text before it', () => {
    const parser = new StdioMarkerParser(NONCE)
    expect(parser.push(mark(0))).toEqual([{ text: '', marker: 0 }])
  })

  it('returns several markers from one chunk in order, with their counts', () => {
    const parser = new StdioMarkerParser(NONCE)
    expect(parser.push(`banner\n${mark(0)}one\n${mark(1)}two\n${mark(2)}`)).toEqual([
      { text: 'banner\n', marker: 0 },
      { text: 'one\n', marker: 1 },
      { text: 'two\n', marker: 2 },
    ])
  })

  it('reassembles a marker split at every possible position', () => {
    const stream = `reply one\n${mark(12)}reply two\n${mark(13)}`
    for (let cut = 0; cut <= stream.length; cut++) {
      expect(feed([stream.slice(0, cut), stream.slice(cut)]), `cut at ${cut}`).toEqual([
        { text: 'reply one\n', marker: 12 },
        { text: 'reply two\n', marker: 13 },
      ])
    }
  })

  it('reassembles a marker delivered one character at a time', () => {
    const stream = `a${mark(7)}b`
    expect(feed([...stream])).toEqual([{ text: 'a', marker: 7 }, { text: 'b' }])
  })

  it('holds back only a possible marker prefix and releases it when it is not one', () => {
    const parser = new StdioMarkerParser(NONCE)
    expect(parser.push(`text${MARK_START}0123`)).toEqual([{ text: 'text' }])
    // The held-back bytes turn out to be ordinary output.
    expect(parser.push('xyz\n')).toEqual([{ text: `${MARK_START}0123xyz\n` }])
  })

  it('streams text without a marker immediately', () => {
    const parser = new StdioMarkerParser(NONCE)
    expect(parser.push('partial line')).toEqual([{ text: 'partial line' }])
    expect(parser.push(' more\n')).toEqual([{ text: ' more\n' }])
  })

  it('keeps stale and current marker counts distinct', () => {
    const out = feed([`${mark(0)}late output of line 0\n${mark(0)}`, `reply\n${mark(1)}`])
    expect(out.map((c) => c.marker)).toEqual([0, 0, 1])
    expect(out[1]?.text).toBe('late output of line 0\n')
    expect(out[2]?.text).toBe('reply\n')
  })

  it('treats a marker with another nonce as ordinary output', () => {
    const foreign = mark(3, 'ffffffffffffffff')
    expect(feed([`x${foreign}y`])).toEqual([{ text: `x${foreign}y` }])
  })

  it('keeps multi-byte text intact around markers', () => {
    expect(feed(['héllo ✓ ', mark(1), '日本'])).toEqual([{ text: 'héllo ✓ ', marker: 1 }, { text: '日本' }])
  })

  it('returns an unterminated marker on flush', () => {
    const parser = new StdioMarkerParser(NONCE)
    expect(parser.push(`done${MARK_START}${NONCE}:4`)).toEqual([{ text: 'done' }])
    expect(parser.flush()).toBe(`${MARK_START}${NONCE}:4`)
  })
})
