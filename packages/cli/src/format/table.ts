import Table from 'cli-table3'

/** A borderless, left-aligned table with two spaces between columns (like `docker ps`). */
export function renderTable(
  head: string[],
  rows: string[][],
  style: (h: string) => string = (h) => h,
): string {
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
