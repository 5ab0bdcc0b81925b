import { describe, expect, it } from 'vitest'
import { LineSplitter } from './line-splitter.js'

describe('LineSplitter', () => {
  it('gives each line once it ends, whatever the pieces it came in, and what is left at the end', () => {
    const lines = new LineSplitter()
    expect(lines.push('a')).toEqual([])
    expect(lines.push('b\ncd')).toEqual(['ab'])
    expect(lines.pendingChars).toBe(2)
    expect(lines.push('\n\ne\nf')).toEqual(['cd', '', 'e'])
    expect(lines.push('g')).toEqual([])
    expect(lines.pendingChars).toBe(2)
    expect(lines.rest()).toBe('fg')
    expect(lines.pendingChars).toBe(0)
    expect(lines.push('\n')).toEqual([''])
  })
})
