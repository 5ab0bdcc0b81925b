import { diffArrays } from 'diff'

/** A file larger than this on any side is merged as binary (whole versions, never by line). */
export const MAX_TEXT_MERGE_BYTES = 1024 * 1024
/**
 * Each of the two line diffs (base to each side, jsdiff's Myers diff, on the event loop) gives up
 * after this long: the file is then listed as a conflict instead of merged. A 20,000-line file
 * with a change on each side takes about 50 ms.
 */
export const LINE_DIFF_TIMEOUT_MS = 200

const utf8 = new TextDecoder('utf-8', { fatal: true })

/** The file's text, or undefined when it is binary: a NUL byte, or bytes that are not UTF-8. */
export function textOf(bytes: Buffer): string | undefined {
  if (bytes.includes(0)) return undefined
  try {
    return utf8.decode(bytes)
  } catch {
    return undefined
  }
}

/** Lines with their line ends, so a last line without one stays without one. */
export function splitLines(text: string): string[] {
  const lines: string[] = []
  let start = 0
  for (let at = text.indexOf('\n'); at !== -1; at = text.indexOf('\n', start)) {
    lines.push(text.slice(start, at + 1))
    start = at + 1
  }
  if (start < text.length) lines.push(text.slice(start))
  return lines
}

/** A change of one side: base lines [start, end) replaced by `lines` (start = end: an insertion). */
interface Hunk {
  start: number
  end: number
  lines: string[]
}

/** The changes from `base` to `side`, or undefined when the diff took too long. */
function hunksOf(base: string[], side: string[]): Hunk[] | undefined {
  const changes = diffArrays(base, side, { timeout: LINE_DIFF_TIMEOUT_MS })
  if (!changes) return undefined
  const hunks: Hunk[] = []
  let at = 0
  let open: Hunk | undefined
  for (const change of changes) {
    if (!change.added && !change.removed) {
      if (open) hunks.push(open)
      open = undefined
      at += change.value.length
      continue
    }
    open ??= { start: at, end: at, lines: [] }
    if (change.removed) {
      at += change.value.length
      open.end = at
    } else open.lines.push(...change.value)
  }
  if (open) hunks.push(open)
  return hunks
}

/** A side's version of base lines [start, end), given its hunks inside that range. */
function sideOf(base: string[], hunks: Hunk[], start: number, end: number): string[] {
  const out: string[] = []
  let at = start
  for (const hunk of hunks) {
    out.push(...base.slice(at, hunk.start), ...hunk.lines)
    at = hunk.end
  }
  out.push(...base.slice(at, end))
  return out
}

const sameLines = (a: string[], b: string[]) => a.length === b.length && a.every((line, i) => line === b[i])

/** A run of base lines that one or both sides changed, with each side's hunks in it. */
interface Region {
  start: number
  end: number
  ours: Hunk[]
  theirs: Hunk[]
}

/** Groups both sides' hunks into regions: hunks that overlap or touch fall in one region. */
function regionsOf(ours: Hunk[], theirs: Hunk[]): Region[] {
  const all = [
    ...ours.map((hunk) => ({ hunk, side: 'ours' as const })),
    ...theirs.map((hunk) => ({ hunk, side: 'theirs' as const })),
  ].sort((a, b) => a.hunk.start - b.hunk.start || a.hunk.end - b.hunk.end)
  const regions: Region[] = []
  let last: Region | undefined
  for (const { hunk, side } of all) {
    if (!last || hunk.start > last.end) {
      last = { start: hunk.start, end: hunk.end, ours: [], theirs: [] }
      regions.push(last)
    }
    last.end = Math.max(last.end, hunk.end)
    last[side].push(hunk)
  }
  return regions
}

export interface MarkerLabels {
  ours: string
  base: string
  theirs: string
}

export type TextMergeResult =
  | { clean: true; text: string }
  | { clean: false; text: string; conflicts: number }
  | { clean: false; text: undefined; reason: string }

const endLine = (block: string[]) => {
  const last = block[block.length - 1]
  return last === undefined || last.endsWith('\n') ? block : [...block.slice(0, -1), `${last}\n`]
}

/**
 * Merges two texts derived from `base` line by line: the line diffs from the base to each side
 * are jsdiff's; changes to lines apart both land, changes that overlap or touch (the same lines,
 * lines next to each other, two insertions at one place) are a conflict unless both made the same
 * change, answered with the text carrying diff3-style markers (ours, base, theirs).
 */
export function mergeText(ours: string, base: string, theirs: string, labels: MarkerLabels): TextMergeResult {
  const [o, b, t] = [splitLines(ours), splitLines(base), splitLines(theirs)]
  const [oursHunks, theirsHunks] = [hunksOf(b, o), hunksOf(b, t)]
  if (!oursHunks || !theirsHunks)
    return {
      clean: false,
      text: undefined,
      reason: `the line diff took longer than ${LINE_DIFF_TIMEOUT_MS} ms (a file changed throughout)`,
    }
  const out: string[] = []
  let at = 0
  let conflicts = 0
  for (const region of regionsOf(oursHunks, theirsHunks)) {
    out.push(...b.slice(at, region.start))
    at = region.end
    const mine = sideOf(b, region.ours, region.start, region.end)
    const other = sideOf(b, region.theirs, region.start, region.end)
    if (region.theirs.length === 0 || sameLines(mine, other)) out.push(...mine)
    else if (region.ours.length === 0) out.push(...other)
    else {
      conflicts++
      out.push(`<<<<<<< ${labels.ours}\n`, ...endLine(mine))
      out.push(`||||||| ${labels.base}\n`, ...endLine(b.slice(region.start, region.end)))
      out.push('=======\n', ...endLine(other), `>>>>>>> ${labels.theirs}\n`)
    }
  }
  out.push(...b.slice(at))
  const text = out.join('')
  return conflicts === 0 ? { clean: true, text } : { clean: false, text, conflicts }
}
