/** Small syntax highlighting: comments, strings, numbers and keywords, by file extension. DOM nodes only. */

interface Grammar {
  comment?: string
  string: string
  keywords: string[]
}

const DQ = String.raw`"(?:\\.|[^"\\\n])*"`
const SQ = String.raw`'(?:\\.|[^'\\\n])*'`
const BT = String.raw`\`(?:\\.|[^\`\\])*\``

const C_LIKE: Grammar = {
  comment: String.raw`\/\/[^\n]*|\/\*[\s\S]*?\*\/`,
  string: `${DQ}|${SQ}|${BT}`,
  keywords: (
    'async await break case catch class const continue default delete do else enum export extends false ' +
    'finally for from function if implements import in instanceof interface let new null of package ' +
    'private protected public return static super switch this throw true try type typeof undefined var ' +
    'void while yield fn func go impl mut pub struct use match loop trait'
  ).split(' '),
}
const HASH: Grammar = {
  comment: '#[^\\n]*',
  string: `${DQ}|${SQ}`,
  keywords: (
    'and as assert async await break class continue def del elif else except False finally for from ' +
    'global if import in is lambda None nonlocal not or pass raise return True try while with yield ' +
    'then fi do done esac case function local export echo true false null yes no'
  ).split(' '),
}
const MARKUP: Grammar = { comment: '<!--[\\s\\S]*?-->', string: `${DQ}|${SQ}`, keywords: [] }
const JSON_GRAMMAR: Grammar = { string: DQ, keywords: ['true', 'false', 'null'] }

const BY_EXTENSION: Record<string, Grammar> = {}
for (const ext of 'js mjs cjs ts tsx jsx mts cts java c h cc cpp hpp go rs css scss kt swift cs'.split(' '))
  BY_EXTENSION[ext] = C_LIKE
for (const ext of 'py sh bash zsh yaml yml toml rb r ini conf cfg env dockerfile makefile'.split(' '))
  BY_EXTENSION[ext] = HASH
for (const ext of 'html htm xml svg vue'.split(' ')) BY_EXTENSION[ext] = MARKUP
for (const ext of 'json jsonl ndjson map'.split(' ')) BY_EXTENSION[ext] = JSON_GRAMMAR

const compiled = new Map<Grammar, RegExp>()

function regexOf(grammar: Grammar): RegExp {
  let re = compiled.get(grammar)
  if (!re) {
    const parts = [
      grammar.comment ?? '(?!)',
      grammar.string,
      String.raw`\b\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?\b|\b0[xX][\da-fA-F]+\b`,
      grammar.keywords.length ? `\\b(?:${grammar.keywords.join('|')})\\b` : '(?!)',
    ]
    re = new RegExp(parts.map((p) => `(${p})`).join('|'), 'g')
    compiled.set(grammar, re)
  }
  return re
}

export function grammarFor(path: string): Grammar | undefined {
  const name = path.split('/').pop()?.toLowerCase() ?? ''
  if (name === 'dockerfile' || name === 'makefile') return BY_EXTENSION[name]
  const ext = name.includes('.') ? name.split('.').pop() : ''
  return ext ? BY_EXTENSION[ext] : undefined
}

const CLASSES = ['tok-comment', 'tok-string', 'tok-number', 'tok-keyword']

/** A `<code>` with the text highlighted for the file's language (plain text past 300 KB). */
export function highlight(text: string, path: string): HTMLElement {
  const code = document.createElement('code')
  const grammar = grammarFor(path)
  if (!grammar || text.length > 300_000) {
    code.textContent = text
    return code
  }
  const re = regexOf(grammar)
  re.lastIndex = 0
  let last = 0
  for (let m = re.exec(text); m !== null; m = re.exec(text)) {
    if (m[0] === '') {
      re.lastIndex++
      continue
    }
    if (m.index > last) code.append(text.slice(last, m.index))
    const group = m.slice(1).findIndex((g) => g !== undefined)
    const span = document.createElement('span')
    span.className = CLASSES[group] ?? ''
    span.textContent = m[0]
    code.append(span)
    last = m.index + m[0].length
  }
  if (last < text.length) code.append(text.slice(last))
  return code
}
