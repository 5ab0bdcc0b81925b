import Table from 'cli-table3'

/** Printable ASCII: a character a column, one line. */
const PLAIN = /^[\x20-\x7e]*$/
/** SGR escapes (colours), which take no column. */
const SGR = /\x1b\[[0-9;]*m/g

/** The columns `text` takes when it is printable ASCII and SGR escapes; else undefined. */
function plainWidth(text: string): number | undefined {
  const visible = text.replace(SGR, '')
  return PLAIN.test(visible) ? visible.length : undefined
}

/**
 * The table as cli-table3 draws it (below) when every cell is printable ASCII (and SGR escapes) and
 * every row has a cell under each heading, without measuring widths as a terminal does
 * (string-width and its emoji regular expression: ~2 ms of every `cairn … list`,
 * docs/benchmarks/cli.md). format.test.ts holds the two to the same text.
 */
export function plainTable(
  head: string[],
  rows: string[][],
  style: (h: string) => string,
): string | undefined {
  const lines = [head.map(style), ...rows]
  const widths = lines.map((cells) => cells.map(plainWidth))
  if (!widths.every((w) => w.length === head.length && w.every((n) => n !== undefined))) return undefined
  // A column is one wide at the least, as in cli-table3.
  const columns = head.map((_, i) => Math.max(1, ...widths.map((w) => w[i] as number)))
  return lines
    .map((cells, l) =>
      cells
        .map((cell, i) => cell + ' '.repeat((columns[i] as number) - (widths[l]?.[i] as number)))
        .join('  ')
        .trimEnd(),
    )
    .join('\n')
}

/** A borderless, left-aligned table with two spaces between columns (like `docker ps`). */
export function renderTable(
  head: string[],
  rows: string[][],
  style: (h: string) => string = (h) => h,
): string {
  return plainTable(head, rows, style) ?? drawnTable(head, rows, style)
}

/** The table drawn by cli-table3: any text (wide characters, escapes, lines), measured as a terminal shows it. */
export function drawnTable(head: string[], rows: string[][], style: (h: string) => string): string {
  const table = new Table({
    head: head.map(style),
    chars: {
      top: '',
      'top-mid': '',
      'top-left': '',
      'top-right': '',
      bottom: '',
      'bottom-mid': '',
      'bottom-left': '',
      'bottom-right': '',
      left: '',
      'left-mid': '',
      mid: '',
      'mid-mid': '',
      right: '',
      'right-mid': '',
      middle: '  ',
    },
    style: { 'padding-left': 0, 'padding-right': 0, head: [], border: [] },
    wordWrap: false,
  })
  table.push(...rows)
  return table
    .toString()
    .split('\n')
    .map((line) => line.trimEnd())
    .join('\n')
}

/** `key: value` lines with the keys padded to one width. */
export function renderFields(fields: [string, string][], style: (k: string) => string = (k) => k): string {
  const width = Math.max(0, ...fields.map(([k]) => k.length))
  return fields.map(([k, v]) => `${style(`${k}:`.padEnd(width + 1))} ${v}`).join('\n')
}
