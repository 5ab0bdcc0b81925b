import { describe, expect, it } from 'vitest'
import { ClippedText, shareLimit } from './output.js'

const text = (chunks: string[], limitChars: number) => {
  const clipped = new ClippedText(limitChars)
  for (const chunk of chunks) clipped.push(new TextEncoder().encode(chunk))
  clipped.end()
  return clipped
}

describe('ClippedText', () => {
  it('gives back short output whole, a character split across chunks included', () => {
    const bytes = new TextEncoder().encode('naïve\n')
    const clipped = new ClippedText(100)
    clipped.push(bytes.subarray(0, 3))
    clipped.push(bytes.subarray(3))
    clipped.end()
    expect(clipped.clip(100)).toBe('naïve\n')
    expect(clipped.totalChars).toBe(6)
  })

  it('keeps the start and the end of long output within the limit, and counts what it left out', () => {
    const chunks = Array.from({ length: 5000 }, (_, i) => `line ${i}\n`)
    const clipped = text(chunks, 200)
    const all = chunks.join('')
    expect(clipped.totalChars).toBe(all.length)
    const out = clipped.clip(200)
    expect(out.length).toBeLessThanOrEqual(200)
    const [start, end] = out.split(/\n\[… \d+ characters left out …\]\n/)
    expect(all.startsWith(start ?? '')).toBe(true)
    expect(all.endsWith(end ?? '')).toBe(true)
    const left = Number(/\[… (\d+) characters/.exec(out)?.[1])
    expect((start?.length ?? 0) + left + (end?.length ?? 0)).toBe(all.length)
    // A smaller share of the same stream (its limit split with stderr) fits too.
    expect(clipped.clip(120).length).toBeLessThanOrEqual(120)
    // A limit too small for the note: the start only.
    expect(clipped.clip(10)).toBe(all.slice(0, 10))
  })
})

describe('shareLimit', () => {
  it('gives each stream what it needs when both fit, else half each and the rest to the other', () => {
    expect(shareLimit(100, 30, 40)).toEqual([30, 40])
    expect(shareLimit(100, 10, 1000)).toEqual([10, 90])
    expect(shareLimit(100, 1000, 10)).toEqual([90, 10])
    expect(shareLimit(100, 1000, 1000)).toEqual([50, 50])
    expect(shareLimit(101, 1000, 1000)).toEqual([51, 50])
  })
})
