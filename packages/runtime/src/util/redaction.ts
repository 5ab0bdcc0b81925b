/**
 * Redaction of secret values from what the server keeps and shows (transcripts, turn events,
 * setup and build logs). Each value is looked for as written and in the forms a program commonly
 * prints it in: JSON-escaped (non-ASCII kept, or escaped as Python does), percent-encoded (as `encodeURIComponent`, `encodeURI` and forms
 * encode it, hex digits in either case), hex in either case, and base64 (standard and URL-safe)
 * at each of the three alignments it can take inside a longer encoded text: the characters that
 * depend on the value's bytes alone. A value of several lines is also looked for line by line, for
 * logs kept as lines. What this cannot catch is in docs/security.md.
 */

/** Values shorter than this are not redacted: see docs/security.md (what redaction cannot catch). */
export const MIN_REDACTED_LENGTH = 4

/** A line of a several-line value shorter than this is not looked for on its own. */
const MIN_LINE_LENGTH = 8

/** The characters of base64(`bytes`), placed `offset` bytes into an encoded text, fixed by `bytes` alone. */
function base64Core(bytes: Buffer, offset: number): string {
  const encoded = Buffer.concat([Buffer.alloc(offset), bytes]).toString('base64')
  const from = Math.ceil((offset * 8) / 6)
  const to = Math.floor(((offset + bytes.length) * 8) / 6)
  return encoded.slice(from, to)
}

const attempt = (encode: () => string): string | undefined => {
  try {
    return encode()
  } catch {
    return undefined
  }
}

/** A JSON string's text with every non-ASCII code unit escaped, as Python's `json.dumps` writes it. */
const asciiJson = (json: string) =>
  json.replace(/[\u0080-\uffff]/g, (unit) => `\\u${unit.charCodeAt(0).toString(16).padStart(4, '0')}`)

const lowerHexEscapes = (text: string) => text.replace(/%[0-9A-F]{2}/g, (digits) => digits.toLowerCase())

/** Every form of `value` that redaction looks for (the value itself first). */
export function secretForms(value: string): string[] {
  if (value.length < MIN_REDACTED_LENGTH) return []
  const bytes = Buffer.from(value, 'utf8')
  const percent = [
    () => encodeURIComponent(value),
    () => encodeURI(value),
    () => new URLSearchParams({ v: value }).toString().slice(2),
  ].flatMap((encode) => {
    // A value that is not well-formed UTF-16 (a lone surrogate) has no URI encoding.
    const form = attempt(encode)
    return form === undefined ? [] : [form, lowerHexEscapes(form)]
  })
  const base64 = [0, 1, 2].map((offset) => base64Core(bytes, offset))
  const json = JSON.stringify(value).slice(1, -1)
  const forms = [
    value,
    json,
    asciiJson(json),
    ...percent,
    bytes.toString('hex'),
    bytes.toString('hex').toUpperCase(),
    ...base64,
    ...base64.map((form) => form.replace(/\+/g, '-').replace(/\//g, '_')),
    ...value.split(/\r?\n/).filter((line) => line.length >= MIN_LINE_LENGTH && line !== value),
  ]
  return [...new Set(forms.filter((form) => form.length >= MIN_REDACTED_LENGTH))]
}

const escapeRegExp = (text: string) => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')

/** Redacts the values of one set of secrets (`name` → value) from texts and streams of text. */
export class Redactor {
  /** Each form → the secret it is a form of. */
  private readonly names = new Map<string, string>()
  /** Every form, longest first (so the longest match at a position wins). */
  private readonly pattern: RegExp | undefined
  /** Forms by their first character, for finding a form's start at the end of a chunk. */
  private readonly byFirst = new Map<string, string[]>()
  readonly longestForm: number = 0

  /**
   * `bytes`: the texts redacted are bytes read as latin1 (one character a byte: a command's
   * output), so each form is looked for as its UTF-8 bytes.
   */
  constructor(secrets: Readonly<Record<string, string>>, options: { bytes?: boolean } = {}) {
    const asText = (form: string) => (options.bytes ? Buffer.from(form, 'utf8').toString('latin1') : form)
    for (const [name, value] of Object.entries(secrets)) {
      for (const form of secretForms(value).map(asText)) if (!this.names.has(form)) this.names.set(form, name)
    }
    const forms = [...this.names.keys()].sort((a, b) => b.length - a.length)
    this.pattern = forms.length > 0 ? new RegExp(forms.map(escapeRegExp).join('|'), 'g') : undefined
    for (const form of forms) {
      const first = form[0] as string
      this.byFirst.set(first, [...(this.byFirst.get(first) ?? []), form])
      this.longestForm = Math.max(this.longestForm, form.length)
    }
  }

  /** `text` with every form of every value replaced by `[redacted:NAME]`. */
  redact(text: string): string {
    if (!this.pattern) return text
    return text.replace(this.pattern, (form) => this.marker(form))
  }

  /** A redacting stream: text written in chunks, a value possibly split between them. */
  stream(): RedactingStream {
    return new RedactingStream(this)
  }

  marker(form: string): string {
    return `[redacted:${this.names.get(form) ?? 'secret'}]`
  }

  /** Where in `text` a form may begin that `text` ends before finishing (its length when nowhere). */
  openFormStart(text: string): number {
    for (let at = Math.max(0, text.length - this.longestForm + 1); at < text.length; at++) {
      const candidates = this.byFirst.get(text[at] as string)
      if (!candidates) continue
      const tail = text.slice(at)
      if (candidates.some((form) => form.length > tail.length && form.startsWith(tail))) return at
    }
    return text.length
  }

  /** Every match of a form in `text`, in order (by `exec`: `matchAll` compiles a copy each call). */
  matches(text: string): { at: number; form: string }[] {
    const pattern = this.pattern
    if (!pattern) return []
    const found: { at: number; form: string }[] = []
    pattern.lastIndex = 0
    for (let match = pattern.exec(text); match; match = pattern.exec(text))
      found.push({ at: match.index, form: match[0] })
    return found
  }
}

/**
 * Text redacted as it is written: what could still be the start of a form is held back until
 * the next chunk shows whether it is (at most the longest form's length less one character).
 */
export class RedactingStream {
  private held = ''

  constructor(private readonly redactor: Redactor) {}

  /** What of the text so far can be shown now, redacted. */
  write(chunk: string): string {
    const text = this.held + chunk
    const open = this.redactor.openFormStart(text)
    let out = ''
    let shown = 0
    for (const { at, form } of this.redactor.matches(text)) {
      if (at >= open) break
      out += text.slice(shown, at) + this.redactor.marker(form)
      shown = at + form.length
    }
    const cut = Math.max(open, shown)
    out += text.slice(shown, cut)
    this.held = text.slice(cut)
    return out
  }

  /** The rest, redacted: the text has ended (or is interrupted by something else). */
  end(): string {
    const rest = this.redactor.redact(this.held)
    this.held = ''
    return rest
  }
}

/**
 * A byte stream (a command's stdout or stderr) redacted as it comes, like `RedactingStream`; after
 * `end` (the command has ended) what still comes is redacted a chunk at a time, nothing held.
 */
export class RedactingByteStream {
  private readonly text: RedactingStream
  private ended = false

  /** `redactor` made with `bytes: true`. */
  constructor(private readonly redactor: Redactor) {
    this.text = redactor.stream()
  }

  write(chunk: Buffer): Buffer {
    const text = chunk.toString('latin1')
    return Buffer.from(this.ended ? this.redactor.redact(text) : this.text.write(text), 'latin1')
  }

  end(): Buffer {
    this.ended = true
    return Buffer.from(this.text.end(), 'latin1')
  }
}
