/**
 * Unknown keys, named: a key no schema reads (a typo such as `netwrok:` would silently drop a
 * policy) is refused with the key, where it is, and the nearest known key. Shared by cairn.yaml
 * and request bodies, so both say it the same way.
 */

/** A JSON schema as far as keys go (TypeBox schemas are JSON schemas). */
interface KeyedSchema {
  type?: unknown
  properties?: Record<string, KeyedSchema>
  patternProperties?: Record<string, KeyedSchema>
  additionalProperties?: unknown
  anyOf?: KeyedSchema[]
  items?: KeyedSchema
}

export interface UnknownKey {
  key: string
  /** The keys of the object that holds it, e.g. ['limits']; empty at the top level. */
  path: string[]
  known: string[]
}

/** Optimal-string-alignment distance: edits, with a swap of two neighbours counted as one. */
export function editDistance(a: string, b: string): number {
  const rows = Array.from({ length: a.length + 1 }, (_, i) =>
    Array.from({ length: b.length + 1 }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)),
  )
  const at = (i: number, j: number) => rows[i]?.[j] ?? Number.POSITIVE_INFINITY
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1
      let best = Math.min(at(i - 1, j) + 1, at(i, j - 1) + 1, at(i - 1, j - 1) + cost)
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1])
        best = Math.min(best, at(i - 2, j - 2) + 1)
      ;(rows[i] as number[])[j] = best
    }
  }
  return at(a.length, b.length)
}

/** The known key closest to `key` (a typo, another case), when one is close enough to be meant. */
export function nearestKey(key: string, known: readonly string[]): string | undefined {
  const lower = key.toLowerCase()
  let best: { key: string; distance: number } | undefined
  for (const candidate of known) {
    const distance = editDistance(lower, candidate.toLowerCase())
    if (best === undefined || distance < best.distance) best = { key: candidate, distance }
  }
  if (best === undefined) return undefined
  const allowed = Math.min(3, Math.max(1, Math.floor(Math.max(key.length, best.key.length) / 3)))
  return best.distance <= allowed ? best.key : undefined
}

/**
 * `unknown key 'netwrok' in cairn.yaml; did you mean 'network'?` (or the known keys listed when
 * none is close). `where` names the document or body, `path` the object inside it.
 */
export function unknownKeyMessage(
  found: UnknownKey,
  where: string,
  noun = 'key',
  planned: Readonly<Record<string, string>> = {},
): string {
  const inside = found.path.length > 0 ? `'${found.path.join('.')}' of ${where}` : where
  const plan = found.path.length === 0 ? planned[found.key] : undefined
  if (plan !== undefined) return `${noun} '${found.key}' in ${inside} is not supported yet: ${plan}`
  const near = nearestKey(found.key, found.known)
  const hint =
    near !== undefined
      ? `did you mean '${near}'?`
      : found.known.length > 0
        ? `known ${noun}s: ${found.known.join(', ')}`
        : `it takes no ${noun}s`
  return `unknown ${noun} '${found.key}' in ${inside}; ${hint}`
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value)
}

/**
 * The first key in `value` that `schema` does not name, at any depth: objects with fixed
 * properties, the object member of a union, array items. Objects whose keys are free (a record
 * of environment variables) are not looked into.
 */
export function findUnknownKey(schema: object, value: unknown, path: string[] = []): UnknownKey | undefined {
  return walk(schema as KeyedSchema, value, path)
}

function walk(schema: KeyedSchema, value: unknown, path: string[]): UnknownKey | undefined {
  if (schema.anyOf) {
    // The member of the value's own shape: an object for an object, an array for an array.
    const member = schema.anyOf.find((m) =>
      isPlainObject(value) ? m.type === 'object' : Array.isArray(value) ? m.type === 'array' : false,
    )
    return member ? walk(member, value, path) : undefined
  }
  if (Array.isArray(value) && schema.items) {
    for (const [index, item] of value.entries()) {
      const found = walk(schema.items, item, [...path, String(index)])
      if (found) return found
    }
    return undefined
  }
  if (!isPlainObject(value) || schema.properties === undefined) return undefined
  const known = Object.keys(schema.properties)
  const free = schema.patternProperties !== undefined || isPlainObject(schema.additionalProperties)
  for (const [key, child] of Object.entries(value)) {
    const property = schema.properties[key]
    if (property === undefined) {
      if (free || schema.additionalProperties === true) continue
      return { key, path, known }
    }
    const found = walk(property, child, [...path, key])
    if (found) return found
  }
  return undefined
}
