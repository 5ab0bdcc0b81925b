// Writes packages/sdk/src/validators.ts: the SDK's response checks, generated from @cairn/protocol's
// schemas with TypeBox's compiler (`TypeCompiler.Code`), so that neither TypeBox's type builders nor
// the protocol's schemas are loaded, and nothing is compiled, when a client starts (a `cairn` command
// makes one request: bench/cli.ts). The schemas themselves go in as JSON, parsed only when a response
// fails its check, to name the first mismatch with TypeBox's own `Errors` (what `Value.Errors` says).
//
//   node --import tsx packages/sdk/scripts/validators.ts   (writes the file; reads @cairn/protocol's dist)
// `npm run build` runs it after building the protocol, so a changed schema is checked as it now is;
// validators.test.ts fails while the file is not what this script writes (commit it).
import { writeFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import * as protocol from '@cairn/protocol'
import { Kind, type TSchema } from '@sinclair/typebox'
import { TypeCompiler } from '@sinclair/typebox/compiler'
import { SYMBOL_KEYS, typed } from '../src/validator.js'

/** The protocol's schemas that the SDK checks responses against, by their export name. */
export const CHECKED = [
  'AgentDetailSchema',
  'AgentSchema',
  'ApiKeyListSchema',
  'ApprovalListSchema',
  'ApprovalSchema',
  'ArtifactListSchema',
  'ArtifactSchema',
  'BuildLogSchema',
  'CommandListSchema',
  'CommandOutputEventSchema',
  'CommandSchema',
  'CreatedApiKeySchema',
  'CreatedWebhookSchema',
  'DeployResultSchema',
  'DiffSchema',
  'FileEntrySchema',
  'ForksResultSchema',
  'ImageListSchema',
  'MergeResultSchema',
  'MessageSchema',
  'NodeListSchema',
  'NodeSchema',
  'PreviewUrlSchema',
  'RevisionSchema',
  'RuntimeDriversSchema',
  'SecretListSchema',
  'SessionLeaseSchema',
  'SessionManifestSchema',
  'SessionMoveSchema',
  'SessionSchema',
  'SetupInfoSchema',
  'SnapshotSchema',
  'StatusEventSchema',
  'TurnSchema',
  'UsageSchema',
  'WebhookDeliveryListSchema',
  'WebhookListSchema',
  'WebhookSchema',
] as const

export const OUTPUT = fileURLToPath(new URL('../src/validators.ts', import.meta.url))

type Plain = { [key: string]: unknown }

/** A schema's annotations: neither its check nor its errors read them (the OpenAPI document does). */
const ANNOTATIONS = new Set(['description', 'title', 'examples', 'default'])

/**
 * A schema as plain JSON: its symbol keys as `~kind` and the like (an unknown symbol is refused),
 * without annotations.
 */
function plain(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(plain)
  if (typeof value !== 'object' || value === null) return value
  const out: Plain = {}
  const symbols = Object.getOwnPropertySymbols(value)
  for (const symbol of symbols) {
    const name = Object.entries(SYMBOL_KEYS).find(([, s]) => s === symbol)?.[0]
    if (name === undefined) throw new Error(`unexpected symbol ${String(symbol)} in a schema`)
    out[name] = (value as Record<symbol, unknown>)[symbol]
  }
  const isSchema = symbols.includes(Kind)
  for (const [key, v] of Object.entries(value)) if (!(isSchema && ANNOTATIONS.has(key))) out[key] = plain(v)
  return out
}

/** A plain schema back as TypeBox's (symbol keys), for the compiler: as the SDK parses it. */
const asTypeBox = (value: unknown): TSchema => JSON.parse(JSON.stringify(value), typed) as TSchema

/** Stable text of a plain schema (keys sorted), to find the objects several schemas share. */
function keyOf(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(keyOf).join(',')}]`
  if (typeof value !== 'object' || value === null) return JSON.stringify(value)
  const entries = Object.entries(value).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
  return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${keyOf(v)}`).join(',')}}`
}

const isObjectSchema = (v: unknown): v is Plain =>
  typeof v === 'object' && v !== null && !Array.isArray(v) && (v as Plain)['~kind'] === 'Object'

function eachObjectSchema(value: unknown, visit: (schema: Plain) => void): void {
  if (Array.isArray(value)) for (const v of value) eachObjectSchema(v, visit)
  else if (typeof value === 'object' && value !== null) {
    if (isObjectSchema(value)) visit(value)
    for (const v of Object.values(value)) eachObjectSchema(v, visit)
  }
}

/**
 * The checked schemas with every object schema met more than once (a session inside a list, a fork's
 * result …) moved to a named reference (`Ref`), so that its check is one function and its JSON is
 * written once. Only object schemas: a reference never stands where TypeBox looks at the schema
 * itself (a required property that may be undefined), and its checks and errors are those of the
 * schema it names (`Deref`).
 */
function shared(): { roots: Map<string, Plain>; references: Map<string, Plain> } {
  const name = (exported: string) => exported.replace(/Schema$/, '')
  const roots = new Map(
    CHECKED.map((n) => [name(n), plain((protocol as Record<string, unknown>)[n]) as Plain]),
  )
  const counts = new Map<string, number>()
  const named = new Map<string, string>()
  for (const [n, schema] of roots) named.set(keyOf(schema), n)
  for (const schema of roots.values())
    eachObjectSchema(schema, (s) => {
      const key = keyOf(s)
      counts.set(key, (counts.get(key) ?? 0) + 1)
    })
  // Each checked schema by its own name; any other object schema met twice as Shared<n>.
  const idOf = new Map<string, string>(named)
  for (const [key, count] of counts) if (count > 1 && !idOf.has(key)) idOf.set(key, `Shared${idOf.size}`)
  const rewrite = (value: unknown, top: boolean): unknown => {
    if (Array.isArray(value)) return value.map((v) => rewrite(v, false))
    if (typeof value !== 'object' || value === null) return value
    const id = isObjectSchema(value) ? idOf.get(keyOf(value)) : undefined
    if (id !== undefined && !top) {
      const ref: Plain = { '~kind': 'Ref', $ref: id }
      for (const k of ['~optional', '~readonly'] as const) if (k in value) ref[k] = (value as Plain)[k]
      return ref
    }
    const out: Plain = {}
    for (const [k, v] of Object.entries(value)) out[k] = rewrite(v, false)
    return out
  }
  const references = new Map<string, Plain>()
  for (const [n, schema] of roots) references.set(n, { ...(rewrite(schema, true) as Plain), $id: n })
  for (const [key, id] of idOf)
    if (!references.has(id)) references.set(id, { ...(rewrite(JSON.parse(key), true) as Plain), $id: id })
  return { roots, references }
}

/** The module's text. */
export function generateValidators(): string {
  const { roots, references } = shared()
  const refs = [...references.values()].map(asTypeBox)
  const root = asTypeBox({
    '~kind': 'Object',
    type: 'object',
    properties: Object.fromEntries([...roots.keys()].map((n) => [n, { '~kind': 'Ref', $ref: n }])),
    required: [...roots.keys()],
  })
  const code = TypeCompiler.Code(root, refs, { language: 'javascript' })
  // The last statement checks the synthetic root: only the functions it hoisted are wanted.
  const body = code.slice(0, code.lastIndexOf('\nreturn function check('))
  for (const free of ['kind(', 'format(', 'hash(']) {
    if (body.includes(free)) throw new Error(`the generated checks call ${free}): give the module one`)
  }
  // In single quotes: the JSON's own quotes stay as they are.
  const json = `'${JSON.stringify(Object.fromEntries(references)).replaceAll('\\', '\\\\').replaceAll("'", "\\'")}'`
  const exports = [...roots.keys()].map(
    (n) =>
      `export const ${n}: Validator<Static<typeof P.${n}Schema>> = validator(check_${n}, ${JSON.stringify(n)})`,
  )
  return [
    '// @generated by packages/sdk/scripts/validators.ts from @cairn/protocol: do not edit.',
    '// After changing a schema the SDK checks: node --import tsx packages/sdk/scripts/validators.ts',
    '// @ts-nocheck: TypeBox writes the checks untyped; the exports below carry the types.',
    "import type * as P from '@cairn/protocol'",
    "import type { Static } from '@sinclair/typebox'",
    "import { type Validator, validatorsOver } from './validator.js'",
    '',
    `const validator = validatorsOver(${json})`,
    '',
    body,
    '',
    ...exports,
    '',
  ].join('\n')
}

if (process.argv[1] === fileURLToPath(import.meta.url)) writeFileSync(OUTPUT, generateValidators())
