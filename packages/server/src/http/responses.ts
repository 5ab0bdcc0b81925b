import { ERROR_CODES, ErrorBodySchema, StreamEventSchema } from '@cairn/protocol'
import { type TSchema, Type } from '@sinclair/typebox'
import type { FastifyInstance, RouteOptions } from 'fastify'

/**
 * The `schema.response` parts routes share, so the OpenAPI document says what each operation can
 * answer: every status, with its media type and schema. Errors are always JSON in the registry's
 * shape, whatever the success media type of the route.
 */
export interface ResponseSpec {
  description: string
  content: Record<string, { schema: TSchema; [EVENT_DATA_EXTENSION]?: TSchema }>
  /** Response headers worth naming (their JSON schema, with a description). */
  headers?: Record<string, { type: 'string'; description: string }>
}

function codesWithStatus(status: number): string[] {
  return Object.entries(ERROR_CODES)
    .filter(([, spec]) => spec.status === status)
    .map(([code]) => code)
}

function errorResponse(status: number): ResponseSpec {
  const codes = codesWithStatus(status)
  return {
    description: codes.length > 0 ? `Error (code: ${codes.join(', ')})` : 'Error',
    content: { 'application/json': { schema: ErrorBodySchema } },
  }
}

/** The error answers of a route, e.g. `errorResponses(404, 409)`. */
export function errorResponses(...statuses: number[]): Record<number, ResponseSpec> {
  return Object.fromEntries(statuses.map((status) => [status, errorResponse(status)]))
}

/** A success answer that is JSON of `schema`. */
export function jsonResponse(schema: TSchema, description = 'Success'): ResponseSpec {
  return { description, content: { 'application/json': { schema } } }
}

/** A success answer of raw bytes (a file, an archive, a log). */
export function bytesResponse(mediaType: string, description: string): ResponseSpec {
  return { description, content: { [mediaType]: { schema: Type.String({ format: 'binary' }) } } }
}

/** The extension on a `text/event-stream` media type naming the schema of each event's data. */
export const EVENT_DATA_EXTENSION = 'x-cairn-event-data'

/**
 * A `text/event-stream` media type. OpenAPI 3.1 cannot describe the framing of server-sent
 * events, so the body is described as what it is on the wire, text; the schema of each event's
 * `data:` line is in the `x-cairn-event-data` extension: a union whose members are titled with
 * the event names they go with (`event: run.completed` carries the member titled `run.completed`).
 * A checker that reads the document validates the stream as a string, and each event's data
 * against the extension when it knows to.
 */
export function eventStreamMedia(events: TSchema): { schema: TSchema; [EVENT_DATA_EXTENSION]: TSchema } {
  return {
    schema: Type.String({
      description:
        `Server-sent events (text/event-stream), read event by event; the data of each is one JSON object of the schema in ${EVENT_DATA_EXTENSION}, the member titled with the event's name. ${events.description ?? ''}`.trim(),
    }),
    [EVENT_DATA_EXTENSION]: events,
  }
}

/** The answer of a run: an SSE stream whose messages' data are the protocol's stream events. */
export function eventStreamResponse(description: string, headers?: ResponseSpec['headers']): ResponseSpec {
  return {
    description,
    content: { 'text/event-stream': eventStreamMedia(StreamEventSchema) },
    ...(headers ? { headers } : {}),
  }
}

/** The header naming the turn a message began (for `GET …/turns/{turnId}/events` after a drop). */
export const TURN_ID_HEADER: NonNullable<ResponseSpec['headers']> = {
  'Cairn-Turn-Id': {
    type: 'string',
    description:
      'The turn this message began: its stream is picked up again at GET /v1/sessions/{id}/turns/{turnId}/events',
  },
}

/**
 * A request body of raw bytes (an archive, a file), so the document names the media types an
 * upload takes. Its schema accepts anything: the bytes are checked by the handler.
 */
export function bytesBody(
  mediaTypes: string[],
  description: string,
): { content: Record<string, { schema: TSchema }> } {
  return {
    content: Object.fromEntries(mediaTypes.map((type) => [type, { schema: Type.Unknown({ description }) }])),
  }
}

const BODY_METHODS = new Set(['POST', 'PUT', 'PATCH', 'DELETE'])
const WRITE_METHODS = new Set(['POST', 'PUT', 'PATCH'])

/**
 * Documents what the framework answers on every route, before or around its handler: 400 for a
 * path, query or body it cannot read; 408 and 431 for a request too slow or headers larger than it reads; 401 and 429 from the auth hook; 403 for a key without write
 * access on every non-GET route; 413 and 415 from the body parser; 507 on every write (the
 * tenant's storage budget, the pool's quotas); 404 and 410 from the session
 * lookup every `/v1/sessions/{id}…` route starts with; 500 and 503 from the error handler. A route keeps what it declares itself. Registered before the routes, so a new route is
 * covered without doing anything.
 */
export function documentFrameworkAnswers(app: FastifyInstance): void {
  app.addHook('onRoute', (route: RouteOptions) => {
    const schema = route.schema as (Record<string, unknown> & { hide?: boolean }) | undefined
    if (!schema || schema.hide || !route.url.startsWith('/v1/')) return
    const methods = (Array.isArray(route.method) ? route.method : [route.method]).map(String)
    // 408 and 431: a request too slow or its headers too large, refused by the HTTP parser before
    // any route (in the registry's shape, http/errors.ts answerClientError).
    const statuses = [400, 401, 408, 429, 431, 500, 503]
    if (methods.some((m) => m !== 'GET' && m !== 'HEAD')) statuses.push(403)
    if (methods.some((m) => BODY_METHODS.has(m))) statuses.push(413, 415)
    // A write draws on the tenant's storage budget and the pool's quotas (quota_exceeded,
    // images_quota_exceeded): a deploy or a session's creation answered 507 undocumented.
    if (methods.some((m) => WRITE_METHODS.has(m))) statuses.push(507)
    // Every route of one session looks the session up first: a deleted one answers 410.
    if (route.url.startsWith('/v1/sessions/:id')) statuses.push(404, 410)
    const declared = (schema.response ?? {}) as Record<string, unknown>
    route.schema = {
      ...schema,
      response: { ...errorResponses(...statuses.filter((s) => !(s in declared))), ...declared },
    }
  })
}
