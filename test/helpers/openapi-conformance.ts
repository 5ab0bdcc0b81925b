import { Ajv2020, type ValidateFunction } from 'ajv/dist/2020.js'
import addFormats from 'ajv-formats'

/**
 * Checks real answers against the server's own OpenAPI document: the status is one the operation
 * documents, the media type is one documented for that status, and the body (each event of an SSE
 * stream) matches its schema. Driven by the document alone, so a new route is covered as it lands.
 */

// biome-ignore lint/suspicious/noExplicitAny: walking an untyped JSON document
type Json = Record<string, any>

export interface Operation {
  method: string
  template: string
  segments: string[]
  /** status (or range such as "4XX") -> media type -> validator (undefined: no schema to check). */
  responses: Map<string, Map<string, Validator | undefined>>
}

/**
 * Where the document puts the schema of an event stream's data (OpenAPI 3.1 describes the stream
 * itself only as text): a union whose members are titled with their event names.
 */
const EVENT_DATA = 'x-cairn-event-data'

/** A body's validator; for an event stream, its events' data, and one per event name (the titles of its union's members). */
interface Validator {
  body: ValidateFunction
  data: ValidateFunction | undefined
  events: Map<string, ValidateFunction> | undefined
}

export class OpenApiConformance {
  readonly operations: Operation[] = []
  private readonly ajv: Ajv2020

  constructor(readonly doc: Json) {
    this.ajv = new Ajv2020({ strict: false, allErrors: false, validateFormats: true })
    addFormats.default(this.ajv)
    this.ajv.addFormat('binary', true)
    for (const [name, schema] of Object.entries((doc.components?.schemas ?? {}) as Json))
      this.ajv.addSchema(schema, `#/components/schemas/${name}`)
    for (const [template, methods] of Object.entries(doc.paths as Json)) {
      for (const [method, op] of Object.entries(methods as Json)) {
        if (!['get', 'put', 'post', 'delete', 'patch', 'head', 'options'].includes(method)) continue
        const responses = new Map<string, Map<string, Validator | undefined>>()
        for (const [status, response] of Object.entries((op.responses ?? {}) as Json)) {
          const media = new Map<string, Validator | undefined>()
          for (const [type, content] of Object.entries((response.content ?? {}) as Json))
            media.set(type, content.schema === undefined ? undefined : this.validator(content))
          responses.set(status.toUpperCase(), media)
        }
        this.operations.push({
          method: method.toUpperCase(),
          template,
          segments: template.split('/'),
          responses,
        })
      }
    }
  }

  /** A media type's validator: its schema, and for an event stream the schema of each event's data. */
  private validator(media: Json): Validator {
    const events = media[EVENT_DATA] as Json | undefined
    const members = (events?.anyOf ?? events?.oneOf) as Json[] | undefined
    const titled = members?.every((m) => typeof m.title === 'string')
    return {
      body: this.ajv.compile(media.schema),
      data: events ? this.ajv.compile(events) : undefined,
      events: titled ? new Map(members?.map((m) => [m.title as string, this.ajv.compile(m)])) : undefined,
    }
  }

  /** The operation a request path reaches, as the router picks it: a literal segment beats a parameter. */
  match(method: string, pathname: string): Operation | undefined {
    const parts = pathname.split('/')
    let best: { op: Operation; score: number } | undefined
    for (const op of this.operations) {
      if (op.method !== method) continue
      const score = fitScore(op, parts)
      if (score !== undefined && (!best || score > best.score)) best = { op, score }
    }
    return best?.op
  }

  /** The methods the document lists for a request path (any of its templates that fit it), sorted. */
  methodsAt(pathname: string): string[] {
    const parts = pathname.split('/')
    const methods = this.operations.filter((op) => fitScore(op, parts) !== undefined).map((op) => op.method)
    return [...new Set(methods)].sort()
  }

  /** What is wrong with one answer to an operation, or undefined when it conforms. */
  check(op: Operation, status: number, contentType: string, body: Buffer): string | undefined {
    const where = `${op.method} ${op.template} ${status}`
    const response = op.responses.get(String(status)) ?? op.responses.get(`${String(status)[0]}XX`)
    if (!response) return `${where}: status not documented (documents ${[...op.responses.keys()].join(', ')})`
    const mediaType = contentType.split(';')[0]?.trim().toLowerCase() ?? ''
    if (response.size === 0) return body.length === 0 ? undefined : `${where}: body sent, none documented`
    if (!response.has(mediaType))
      return `${where}: media type "${mediaType}" not documented (documents ${[...response.keys()].join(', ')})`
    const validate = response.get(mediaType)
    if (!validate) return `${where} ${mediaType}: documented without a schema`
    if (mediaType === 'text/event-stream') {
      const text = body.toString('utf8')
      if (!validate.body(text))
        return `${where}: the stream does not match its schema: ${this.errors(validate.body)}`
      if (!validate.data) return `${where}: an event stream without ${EVENT_DATA}`
      return this.checkEvents(where, validate, text)
    }
    if (!mediaType.endsWith('json')) return undefined
    let value: unknown
    try {
      value = JSON.parse(body.toString('utf8'))
    } catch {
      return `${where} ${mediaType}: body is not JSON`
    }
    return validate.body(value)
      ? undefined
      : `${where}: body does not match its schema: ${this.errors(validate.body)}`
  }

  /**
   * Each event's data against its schema: the union member titled with the event's name, if named
   * so. A stream none of whose events is named (the data-only framing of the A2A and AG-UI
   * streams) has each checked against the whole union; in a stream of named events, one without a
   * name is the SSE default `message`.
   */
  private checkEvents(where: string, validate: Validator, text: string): string | undefined {
    const messages = text.split(/\r?\n\r?\n/).filter((m) => m.trim() !== '')
    if (messages.length === 0) return `${where}: empty event stream`
    const dataOnly = !/^event:/m.test(text)
    for (const message of messages) {
      let event: string | undefined
      const data: string[] = []
      for (const line of message.split(/\r?\n/)) {
        if (line.startsWith(':')) continue
        const [field, ...rest] = line.split(':')
        const value = rest.join(':').replace(/^ /, '')
        if (field === 'event') event = value
        else if (field === 'data') data.push(value)
      }
      let value: unknown
      try {
        value = JSON.parse(data.join('\n'))
      } catch {
        return `${where}: event "${event ?? 'message'}" data is not JSON`
      }
      if (event === undefined && dataOnly) {
        const all = validate.data as ValidateFunction
        if (!all(value)) return `${where}: an unnamed event does not match: ${this.errors(all)}`
        continue
      }
      event ??= 'message'
      const named = validate.events?.get(event)
      if (validate.events && !named) return `${where}: event "${event}" is not documented`
      const check = named ?? (validate.data as ValidateFunction)
      if (!check(value)) return `${where}: event "${event}" does not match: ${this.errors(check)}`
      const type = (value as { type?: unknown }).type
      if (type !== undefined && type !== event) return `${where}: event named "${event}" carries type ${type}`
    }
    return undefined
  }

  private errors(validate: ValidateFunction): string {
    return this.ajv.errorsText(validate.errors?.slice(0, 3))
  }
}

/** How well an operation's template fits a path's segments (literal segments early weigh most); undefined: not at all. */
function fitScore(op: Operation, parts: string[]): number | undefined {
  if (op.segments.length !== parts.length) return undefined
  let score = 0
  for (let i = 0; i < parts.length; i++) {
    const segment = op.segments[i] as string
    // The router hands an empty segment to a parameter too (its schema then refuses it).
    if (segment.startsWith('{')) continue
    if (segment !== parts[i]) return undefined
    score += 2 ** (parts.length - i)
  }
  return score
}

/**
 * What is wrong with a JSON answer of the server at `url` to `method` `pathname` by its own
 * OpenAPI document (undefined: it conforms), for a test that met an answer the fuzzer cannot reach.
 */
export async function undocumentedAnswer(
  url: string,
  method: string,
  pathname: string,
  answer: { status: number; body: unknown },
): Promise<string | undefined> {
  const conformance = new OpenApiConformance(await (await fetch(`${url}/v1/openapi.json`)).json())
  const op = conformance.match(method, pathname)
  if (!op) return `${method} ${pathname}: no operation of the document`
  return conformance.check(op, answer.status, 'application/json', Buffer.from(JSON.stringify(answer.body)))
}
