/**
 * Text from the API (agent output, titles, error messages) can hold terminal escape sequences that
 * would move the cursor, rewrite the screen, set the window title or hide text. They are removed
 * before anything is printed. Newlines and tabs stay; CRLF becomes LF; a lone CR is dropped.
 */
const ESCAPES = new RegExp(
  [
    // OSC, DCS, SOS, PM, APC strings: ESC ] … (BEL | ESC \), and their 8-bit forms
    '(?:\\x1b[\\]PX^_]|[\\x90\\x98\\x9d\\x9e\\x9f])[\\s\\S]*?(?:\\x07|\\x1b\\\\|\\x9c|$)',
    // CSI: ESC [ (or 0x9b) parameters, intermediates, final byte
    '(?:\\x1b\\[|\\x9b)[\\x30-\\x3f]*[\\x20-\\x2f]*[\\x40-\\x7e]?',
    // Other two- and three-byte escapes (charset selection, keypad modes, …)
    '\\x1b[\\x20-\\x2f]*[\\x30-\\x7e]?',
  ].join('|'),
  'g',
)
const CONTROLS = /[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\x80-\x9f]/g

export function stripTerminalEscapes(text: string): string {
  return text.replace(ESCAPES, '').replace(/\r\n/g, '\n').replace(/\r/g, '').replace(CONTROLS, '')
}

/** One line for a table cell: escapes stripped, whitespace runs folded, cut to `max` characters. */
export function oneLine(text: string, max = Number.POSITIVE_INFINITY): string {
  const flat = stripTerminalEscapes(text).replace(/\s+/g, ' ').trim()
  return truncate(flat, max)
}

export function truncate(text: string, max: number): string {
  const chars = [...text]
  if (chars.length <= max) return text
  return max <= 1 ? chars.slice(0, max).join('') : `${chars.slice(0, max - 1).join('')}…`
}
