import { lstatSync, readdirSync } from 'node:fs'
import path from 'node:path'

/**
 * Deterministic input generation for the fuzz suites. Every choice comes from one seeded PRNG, so
 * a failure reproduces with `FUZZ_SEED=<seed>` (the seed is printed at the start of each suite).
 */
export function fuzzSeed(suite: string, fallback: number): number {
  const fromEnv = process.env.FUZZ_SEED
  const seed = fromEnv === undefined || fromEnv === '' ? fallback : Number(fromEnv) >>> 0
  console.log(`[${suite}] FUZZ_SEED=${seed} (set FUZZ_SEED to reproduce or vary)`)
  return seed
}

/** sfc32: small, fast, good enough statistical quality for test-input generation. */
export class Rng {
  private a: number
  private b: number
  private c: number
  private d: number

  constructor(seed: number) {
    this.a = 0x9e3779b9
    this.b = 0x243f6a88
    this.c = 0xb7e15162
    this.d = seed >>> 0
    for (let i = 0; i < 16; i++) this.u32()
  }

  u32(): number {
    const t = (((this.a + this.b) | 0) + this.d) | 0
    this.d = (this.d + 1) | 0
    this.a = this.b ^ (this.b >>> 9)
    this.b = (this.c + (this.c << 3)) | 0
    this.c = (this.c << 21) | (this.c >>> 11)
    this.c = (this.c + t) | 0
    return t >>> 0
  }

  /** Uniform in [0, 1). */
  next(): number {
    return this.u32() / 4294967296
  }

  /** Uniform integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.next() * n)
  }

  chance(p: number): boolean {
    return this.next() < p
  }

  pick<T>(items: readonly T[]): T {
    if (items.length === 0) throw new Error('pick from an empty list')
    return items[this.int(items.length)] as T
  }

  bytes(n: number): Buffer {
    const out = Buffer.alloc(n)
    for (let i = 0; i < n; i++) out[i] = this.u32() & 0xff
    return out
  }

  /** A child generator, so one consumer's draws do not shift another's. */
  fork(): Rng {
    return new Rng(this.u32())
  }
}

/**
 * Every generated name that could become a file carries this marker, so a file written outside
 * its place by a traversal is found by name afterwards.
 */
export const FUZZ_MARKER = 'cairnfuzz'

const UNICODE = [
  'é',
  'ß',
  '日本語',
  '🦀',
  '👩‍👩‍👧',
  '\u202e',
  '\u200b',
  '\ufeff',
  'ﷺ',
  'Z̤̈',
  '\ud800',
  '\udfff',
  '\u0000',
  '\u0007',
  '\r\n',
  '\t',
  '\u2028',
]
const NAN_ISH = [
  'NaN',
  'Infinity',
  '-Infinity',
  '-1',
  '-0',
  '0',
  '1e309',
  '0x10',
  '1.5',
  '  7',
  '9007199254740993',
  '-9999999999999999999',
  'null',
  'true',
  'false',
  'undefined',
  '[]',
  '{}',
]
const PROTO_KEYS = ['__proto__', 'constructor', 'prototype', 'toString', 'hasOwnProperty', '__defineGetter__']
const INJECTION = [
  "'; DROP TABLE sessions;--",
  '" OR 1=1 --',
  '%',
  '_',
  '*',
  '%s%s%s%n',
  '${process.exit()}',
  '{{7*7}}',
  '$(touch /tmp/cairnfuzz-sh)',
  '`touch /tmp/cairnfuzz-bt`',
  '; touch /tmp/cairnfuzz-semi',
  '-rf',
  '--help',
  '<script>alert(1)</script>',
]

/** Paths that try to leave their place; each names a marker file. */
export function traversal(rng: Rng): string {
  const n = rng.int(1_000_000)
  const name = `${FUZZ_MARKER}-${n}`
  return rng.pick([
    `../../../../../../../../tmp/${name}`,
    `../${name}`,
    `../../${name}`,
    `/tmp/${name}`,
    `/etc/${name}`,
    `a/../../../${name}`,
    `....//....//${name}`,
    `..\\..\\..\\${name}`,
    `%2e%2e%2f%2e%2e%2f${name}`,
    `..%2f..%2f${name}`,
    `./././../${name}`,
    `${name}/../../..`,
    `..`,
    `.`,
    `/`,
    `//`,
    `~/${name}`,
    `/proc/self/cwd/${name}`,
    `/dev/null`,
    `/etc/passwd`,
    `${name}\u0000.txt`,
    `.cairn/${name}`,
    `${name}/`,
  ])
}

function randomChars(rng: Rng, length: number): string {
  let out = ''
  for (let i = 0; i < length; i++) {
    const r = rng.next()
    if (r < 0.6) out += String.fromCharCode(0x20 + rng.int(95))
    else if (r < 0.8) out += rng.pick(UNICODE)
    else if (r < 0.9) out += String.fromCharCode(rng.int(0x20))
    else out += String.fromCharCode(rng.int(0xffff))
  }
  return out
}

/** A hostile string: empty, huge, odd unicode, traversal, NaN-ish, prototype keys, injections. */
export function fuzzString(rng: Rng, options: { maxHuge?: number } = {}): string {
  const maxHuge = options.maxHuge ?? 300_000
  switch (rng.int(12)) {
    case 0:
      return rng.pick(['', ' ', '   ', '\n', '\t'])
    case 1:
      return 'x'.repeat(rng.chance(0.1) ? maxHuge : 200 + rng.int(5000))
    case 2:
      return rng.pick(UNICODE).repeat(1 + rng.int(50))
    case 3:
    case 4:
      return traversal(rng)
    case 5:
      return rng.pick(NAN_ISH)
    case 6:
      return rng.pick(PROTO_KEYS)
    case 7:
      return rng.pick(INJECTION)
    case 8:
      return `${rng.pick(['ses_', 'agt_', 'rev_', 'snp_', 'key_', 'art_', ''])}${randomChars(rng, rng.int(30))}`
    default:
      return randomChars(rng, rng.int(40))
  }
}

/** A random JSON value with bounded size (deep nesting has its own generator). */
export function fuzzJson(rng: Rng, depth = 0): unknown {
  const r = rng.int(depth > 3 ? 6 : 9)
  switch (r) {
    case 0:
      return null
    case 1:
      return rng.chance(0.5)
    case 2:
      return rng.pick([0, -1, 1, -0.5, 1e308, -1e308, 2 ** 53 + 2, -(2 ** 31), 0.1, 1e-300])
    case 3:
    case 4:
      return fuzzString(rng, { maxHuge: 50_000 })
    case 5:
      return rng.int(1_000_000_000) - 500_000_000
    case 6: {
      const items: unknown[] = []
      for (let i = rng.int(5); i > 0; i--) items.push(fuzzJson(rng, depth + 1))
      return items
    }
    default: {
      const out: Record<string, unknown> = {}
      for (let i = rng.int(5); i > 0; i--) out[fuzzString(rng, { maxHuge: 300 })] = fuzzJson(rng, depth + 1)
      return out
    }
  }
}

/** JSON text nested `depth` levels deep (arrays or objects), to probe recursion limits. */
export function deepJson(rng: Rng, depth: number): string {
  if (rng.chance(0.5)) return `${'['.repeat(depth)}1${']'.repeat(depth)}`
  return `${'{"a":'.repeat(depth)}1${'}'.repeat(depth)}`
}

/** The subset of JSON Schema that TypeBox emits into the OpenAPI document. */
export interface JsonSchema {
  type?: string | string[]
  properties?: Record<string, JsonSchema>
  required?: string[]
  additionalProperties?: boolean | JsonSchema
  items?: JsonSchema
  anyOf?: JsonSchema[]
  enum?: unknown[]
  const?: unknown
  minimum?: number
  maximum?: number
  minLength?: number
  maxLength?: number
  maxItems?: number
  pattern?: string
  default?: unknown
}

/**
 * A value that mostly satisfies the schema (strings are short and ASCII, integers in range);
 * `hints` supplies realistic values for named properties (e.g. an existing agent).
 */
export function fromSchema(
  rng: Rng,
  schema: JsonSchema,
  hints: Record<string, unknown[]> = {},
  key = '',
): unknown {
  const hint = hints[key]
  if (hint && rng.chance(0.7)) return rng.pick(hint)
  if (schema.const !== undefined) return schema.const
  if (schema.enum) return rng.pick(schema.enum)
  // With a type of its own, a schema's anyOf only adds rules across its fields (one of two named).
  if (schema.anyOf && schema.type === undefined) return fromSchema(rng, rng.pick(schema.anyOf), hints, key)
  const type = Array.isArray(schema.type) ? rng.pick(schema.type) : schema.type
  switch (type) {
    case 'object': {
      const out: Record<string, unknown> = {}
      const required = [
        ...(schema.required ?? []),
        ...(schema.anyOf ? (rng.pick(schema.anyOf).required ?? []) : []),
      ]
      for (const [name, prop] of Object.entries(schema.properties ?? {})) {
        if (required.includes(name) || rng.chance(0.5)) out[name] = fromSchema(rng, prop, hints, name)
      }
      if (!schema.properties && typeof schema.additionalProperties === 'object') {
        for (let i = rng.int(3); i > 0; i--) {
          out[`K${rng.int(100)}`] = fromSchema(rng, schema.additionalProperties, hints)
        }
      }
      return out
    }
    case 'array': {
      const out: unknown[] = []
      for (let i = rng.int(3); i > 0; i--) out.push(fromSchema(rng, schema.items ?? {}, hints))
      return out
    }
    case 'integer':
    case 'number': {
      const min = schema.minimum ?? 0
      const max = Math.min(schema.maximum ?? min + 100_000, min + 100_000)
      return min + rng.int(max - min + 1)
    }
    case 'boolean':
      return rng.chance(0.5)
    case 'null':
      return null
    case 'string': {
      const min = schema.minLength ?? 0
      const length = Math.max(min, Math.min(schema.maxLength ?? 12, 1 + rng.int(12)))
      let s = ''
      for (let i = 0; i < length; i++) s += String.fromCharCode(0x61 + rng.int(26))
      return `${FUZZ_MARKER}${s}`.slice(0, Math.max(length, min))
    }
    default:
      return fuzzJson(rng)
  }
}

/** Breaks a schema-shaped value in one of many ways (wrong types, limits, extra or missing props). */
export function mutate(rng: Rng, schema: JsonSchema, value: unknown): unknown {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    return rng.chance(0.5) ? fuzzJson(rng) : fuzzString(rng)
  }
  const out: Record<string, unknown> = { ...(value as Record<string, unknown>) }
  const props = Object.keys(schema.properties ?? {})
  const target = props.length > 0 ? rng.pick(props) : `k${rng.int(10)}`
  switch (rng.int(11)) {
    case 0:
      delete out[target]
      break
    case 1:
      out[target] = fuzzString(rng)
      break
    case 2:
      out[target] = rng.pick([-1, -1e9, -0.5, 0.5, 1e308, 2 ** 53 + 1, Number.MAX_SAFE_INTEGER])
      break
    case 3:
      out[target] = rng.pick(['NaN', 'Infinity', '-1', '1e400', '0x1f', ''])
      break
    case 4:
      out[target] = rng.pick([null, true, [], {}, [1, 2], { a: 1 }])
      break
    case 5:
      out[fuzzString(rng, { maxHuge: 200 })] = fuzzJson(rng)
      break
    case 6:
      out[target] = fuzzJson(rng)
      break
    case 7:
      out[target] = 'y'.repeat(rng.chance(0.2) ? 1_500_000 : 70_000)
      break
    case 8:
      out[target] = [fuzzString(rng), fuzzString(rng)]
      break
    default: {
      const sub = schema.properties?.[target]
      if (sub) out[target] = mutate(rng, sub, out[target] ?? fromSchema(rng, sub))
      else out[target] = traversal(rng)
    }
  }
  return out
}

/** JSON text with a prototype-pollution key, which `JSON.stringify` of an object cannot produce. */
export function pollutedJson(rng: Rng, value: unknown): string {
  const key = rng.pick(['__proto__', 'constructor', 'prototype'])
  const payload = rng.pick([
    '{"polluted":true,"isAdmin":true,"role":"admin"}',
    '{"prototype":{"polluted":true}}',
    '1',
    'null',
    '"admin"',
  ])
  const base = value !== null && typeof value === 'object' && !Array.isArray(value) ? value : {}
  const text = JSON.stringify(base)
  const inner = text === '{}' ? '' : `,${text.slice(1, -1)}`
  return `{"${key}":${payload}${inner}}`
}

/** Files (not directories) under `root`, `maxDepth` levels down, as paths relative to it. */
export function listTree(
  root: string,
  maxDepth: number,
  skip: (rel: string) => boolean = () => false,
): string[] {
  const out: string[] = []
  const walk = (dir: string, depth: number) => {
    let names: string[]
    try {
      names = readdirSync(path.join(root, dir))
    } catch {
      return
    }
    for (const name of names) {
      const rel = dir ? `${dir}/${name}` : name
      if (skip(rel)) continue
      out.push(rel)
      if (depth >= maxDepth) continue
      try {
        if (lstatSync(path.join(root, rel)).isDirectory()) walk(rel, depth + 1)
      } catch {
        // Vanished between listing and stat: another process's temporary file.
      }
    }
  }
  walk('', 1)
  return out.sort()
}

/** Places anyone may write to, each with how many levels down to look. */
export type SharedPlaces = readonly (readonly [root: string, depth: number])[]

/** Places anyone may write to (root, and how deep to look), searched for marker-named entries. */
export const SHARED_PLACES: SharedPlaces = [
  ['/', 1],
  ['/tmp', 2],
  ['/var/tmp', 1],
  ['/root', 1],
  ['/etc', 1],
]

/** Entries named with FUZZ_MARKER in `places` (/proc and /sys always skipped): compare before and after. */
export function markerEntries(places: SharedPlaces, skip: (rel: string) => boolean = () => false): string[] {
  const found: string[] = []
  for (const [root, depth] of places)
    for (const rel of listTree(root, depth, (r) => r === 'proc' || r === 'sys' || skip(r)))
      if (rel.includes(FUZZ_MARKER)) found.push(path.join(root, rel))
  return found
}
