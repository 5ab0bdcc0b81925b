import type { JsonSchema } from './fuzz.js'

/** The kinds of value JSON has (an integer is a number; a schema may still refuse 1.5). */
export const JSON_KINDS = ['string', 'number', 'boolean', 'null', 'array', 'object'] as const
export type JsonKind = (typeof JSON_KINDS)[number]

/** One field of a request body: where it is, its schema, and a body that is valid up to it. */
export interface BodyField {
  /** JSON pointer segments from the body's root (an array item is `0`, a map value `K`). */
  path: string[]
  schema: JsonSchema
  /** Puts `value` at `path` in the smallest body that is valid everywhere else. */
  bodyWith(value: unknown): Record<string, unknown>
}

/** The JSON kinds a schema accepts at all (values, ranges and lengths aside); undefined: any. */
export function acceptedKinds(schema: JsonSchema): Set<JsonKind> | undefined {
  // With a type of its own, a schema's anyOf only adds rules across its fields (one of two named).
  if (schema.anyOf && schema.type === undefined) {
    const kinds = new Set<JsonKind>()
    for (const branch of schema.anyOf) {
      const some = acceptedKinds(branch)
      if (!some) return undefined
      for (const kind of some) kinds.add(kind)
    }
    return kinds
  }
  const types = schema.type === undefined ? [] : Array.isArray(schema.type) ? schema.type : [schema.type]
  if (types.length === 0) {
    const fixed = schema.const !== undefined ? [schema.const] : schema.enum
    return fixed ? new Set(fixed.map(kindOf)) : undefined
  }
  return new Set(types.map((type) => (type === 'integer' ? 'number' : type) as JsonKind))
}

export function kindOf(value: unknown): JsonKind {
  if (value === null) return 'null'
  if (Array.isArray(value)) return 'array'
  return typeof value as JsonKind
}

/** The smallest value a schema accepts (its first non-null branch; required properties only). */
export function validValue(schema: JsonSchema): unknown {
  if (schema.const !== undefined) return schema.const
  if (schema.enum) return schema.enum[0]
  if (schema.anyOf && schema.type === undefined) {
    const branch = schema.anyOf.find((b) => b.type !== 'null') ?? schema.anyOf[0]
    return branch ? validValue(branch) : null
  }
  switch (Array.isArray(schema.type) ? schema.type[0] : schema.type) {
    case 'object': {
      const out: Record<string, unknown> = {}
      // An object's anyOf names fields one of which it needs: the first such set.
      const required = [...(schema.required ?? []), ...(schema.anyOf?.[0]?.required ?? [])]
      for (const name of required) out[name] = validValue(schema.properties?.[name] ?? {})
      return out
    }
    case 'array':
      return Array.from({ length: (schema as { minItems?: number }).minItems ?? 0 }, () =>
        validValue(schema.items ?? {}),
      )
    case 'integer':
    case 'number':
      return Math.max(schema.minimum ?? 1, 1)
    case 'boolean':
      return true
    case 'null':
      return null
    default:
      return 'a'.repeat(Math.max(schema.minLength ?? 1, 1))
  }
}

/**
 * A value of `kind` the schema refuses, chosen as a coercing validator would have taken it: the
 * text of a valid value (`"1000"`, `"true"`, `""` for null), `1`/`0`/`false` where a boolean or
 * null is asked for, a valid value wrapped in an array. A number where only an integer goes is
 * `1.5`. Undefined: the schema accepts the kind (or any value).
 */
export function wrongValue(schema: JsonSchema, kind: JsonKind): unknown {
  const accepted = acceptedKinds(schema)
  if (!accepted) return undefined
  const valid = validValue(schema)
  if (accepted.has(kind)) {
    const integerOnly = kind === 'number' && integerOnlyNumbers(schema)
    return integerOnly ? 1.5 : undefined
  }
  switch (kind) {
    case 'string':
      return valid === null ? '' : typeof valid === 'object' ? JSON.stringify(valid) : String(valid)
    case 'number':
      return accepted.has('null') ? 0 : 1
    case 'boolean':
      return !accepted.has('null')
    case 'null':
      return null
    case 'array':
      return [valid]
    case 'object':
      return {}
  }
}

function integerOnlyNumbers(schema: JsonSchema): boolean {
  const branches = schema.anyOf ?? [schema]
  return branches.every((b) => b.type !== 'number' && !(b.anyOf && !integerOnlyNumbers(b)))
}

/**
 * Every field of a body schema: each property, at any depth through objects (and the object
 * branches of unions), each array's items and each map's values.
 */
export function bodyFields(root: JsonSchema): BodyField[] {
  const fields: BodyField[] = []
  const walk = (schema: JsonSchema, path: string[], place: (value: unknown) => Record<string, unknown>) => {
    for (const branch of objectBranches(schema)) {
      const base = validValue(branch) as Record<string, unknown>
      const children: [string, JsonSchema][] = Object.entries(branch.properties ?? {})
      if (typeof branch.additionalProperties === 'object') children.push(['K', branch.additionalProperties])
      for (const [name, child] of children) {
        const childPath = [...path, name]
        const childPlace = (value: unknown) => place({ ...base, [name]: value })
        fields.push({ path: childPath, schema: child, bodyWith: childPlace })
        walk(child, childPath, childPlace)
      }
    }
    for (const branch of [schema, ...(schema.anyOf ?? [])]) {
      if (branch.type !== 'array' || !branch.items) continue
      const items = branch.items
      const itemPath = [...path, '0']
      const itemPlace = (value: unknown) => place([value])
      fields.push({ path: itemPath, schema: items, bodyWith: itemPlace })
      walk(items, itemPath, itemPlace)
    }
  }
  walk(root, [], (value) => value as Record<string, unknown>)
  return fields
}

function objectBranches(schema: JsonSchema): JsonSchema[] {
  return [schema, ...(schema.anyOf ?? [])].filter((b) => b.type === 'object')
}
