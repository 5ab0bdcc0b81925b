import type { TSchema } from '@sinclair/typebox'

/**
 * A response check generated from one of the protocol's schemas (validators.ts): `check` is TypeBox's
 * compiled check of that schema, written out at build time (no code is generated at run time, so none
 * under a browser's CSP either); `schema` parses the schema itself, only when a check fails, for
 * TypeBox's `Errors` to name the first mismatch.
 */
export interface Validator<T> {
  readonly check: (value: unknown) => boolean
  readonly schema: () => { schema: TSchema; references: TSchema[] }
  /** Only carries the type checked for. */
  readonly type?: T
}

/** TypeBox's symbol keys, which the generator writes as these string keys (JSON has no symbols). */
export const SYMBOL_KEYS: Readonly<Record<string, symbol>> = {
  '~kind': Symbol.for('TypeBox.Kind'),
  '~optional': Symbol.for('TypeBox.Optional'),
  '~readonly': Symbol.for('TypeBox.Readonly'),
  '~hint': Symbol.for('TypeBox.Hint'),
}

/** A `JSON.parse` reviver that turns the string keys of SYMBOL_KEYS back into TypeBox's symbols. */
export function typed(this: unknown, _key: string, value: unknown): unknown {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return value
  const record = value as Record<string | symbol, unknown>
  for (const [name, symbol] of Object.entries(SYMBOL_KEYS)) {
    if (!(name in record)) continue
    record[symbol] = record[name]
    delete record[name]
  }
  return value
}

/**
 * The factory of the generated validators over `json`, the schemas they were generated from by `$id`
 * (their shared parts as references): parsed once, at the first failed check.
 */
export function validatorsOver(json: string) {
  let parsed: Record<string, TSchema> | undefined
  const schemas = () => {
    parsed ??= JSON.parse(json, typed) as Record<string, TSchema>
    return parsed
  }
  return <T>(check: (value: unknown) => boolean, id: string): Validator<T> => ({
    check,
    schema: () => {
      const all = schemas()
      return { schema: all[id] as TSchema, references: Object.values(all) }
    },
  })
}
