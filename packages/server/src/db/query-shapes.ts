import type { Compilable, CompiledQuery } from 'kysely'

/** The values a shaped query is run with, by name. */
export type ShapeArgs = Readonly<Record<string, string | number | null>>

/** An object of arguments: each a string, a number or null. */
export type ArgsOf<A> = { readonly [K in keyof A]: string | number | null }

/** A parameter of a compiled shape: one of the arguments, by name, or a value of the shape itself. */
type Slot = { arg: string } | { value: unknown }

interface Shape {
  compiled: CompiledQuery
  slots: Slot[]
}

/** Numbers stand in for numeric arguments from here down (far below any count, size or time). */
const NUMBER_MARK = -(2 ** 52)
const STRING_MARK = (i: number) => `\uE000cairn-arg-${i}\uE001`
const MARKED = /\uE000cairn-arg-\d+\uE001/
/** A numeric stand-in written into a statement's text (Kysely inlines some numbers, `case … then 5`). */
const NUMBER_MARKED = new RegExp(String(NUMBER_MARK).slice(0, 12))

/**
 * The statements a warm turn sends, each built and compiled by Kysely once per shape instead of on
 * every turn (building and compiling was about a third of the server's CPU per warm turn, more
 * than the database's own work). `build` is called once per `key` and argument types with
 * stand-ins for the arguments; the compiled text is kept with the place of each argument among
 * its parameters, and later calls fill those places with their own values.
 *
 * `build` must make the same statement whatever the arguments' values (anything that changes the
 * statement's text goes in `key`); an argument Kysely would inline into the text, or fold into a
 * larger parameter, is refused when the shape is first compiled. `text` is applied to each string
 * argument (PostgreSQL's NUL replacement, which its plugin does while compiling).
 */
export class QueryShapes {
  private readonly shapes = new Map<string, Shape>()

  constructor(private readonly text: (value: string) => string = (value) => value) {}

  compiled<R, A extends ArgsOf<A>>(
    key: string,
    args: A,
    build: (args: A) => Compilable<R>,
  ): CompiledQuery<R> {
    const names = Object.keys(args) as (keyof A & string)[]
    const typed = `${key}|${names.map((name) => `${name}:${typeof args[name] === 'number' ? 'n' : 's'}`).join(',')}`
    let shape = this.shapes.get(typed)
    if (!shape) {
      shape = compileShape(names, args, build)
      this.shapes.set(typed, shape)
    }
    const parameters = shape.slots.map((slot) => {
      if (!('arg' in slot)) return slot.value
      const value = (args as ShapeArgs)[slot.arg] ?? null
      return typeof value === 'string' ? this.text(value) : value
    })
    return { ...shape.compiled, parameters } as CompiledQuery<R>
  }
}

function compileShape<A>(
  names: readonly (keyof A & string)[],
  args: A,
  build: (args: A) => Compilable,
): Shape {
  const standIns: Record<string, string | number> = {}
  const byStandIn = new Map<unknown, string>()
  for (const [i, name] of names.entries()) {
    const standIn = typeof args[name] === 'number' ? NUMBER_MARK - i : STRING_MARK(i)
    standIns[name] = standIn
    byStandIn.set(standIn, name)
  }
  const compiled = build(standIns as A).compile()
  if (MARKED.test(compiled.sql) || NUMBER_MARKED.test(compiled.sql))
    throw new Error(`a shaped query inlined one of its arguments into its text: ${compiled.sql}`)
  const slots = compiled.parameters.map((value): Slot => {
    const arg = byStandIn.get(value)
    if (arg !== undefined) return { arg }
    const folded =
      typeof value === 'string' ? MARKED.test(value) : typeof value === 'number' && value < NUMBER_MARK / 2
    if (folded)
      throw new Error(`a shaped query folded one of its arguments into a parameter: ${compiled.sql}`)
    return { value }
  })
  return { compiled, slots }
}
