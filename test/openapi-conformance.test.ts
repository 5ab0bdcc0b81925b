import { ErrorBodySchema, StreamEventSchema } from '@cairn/protocol'
import { describe, expect, it } from 'vitest'
import { OpenApiConformance } from './helpers/openapi-conformance.js'

/**
 * The checker the request fuzzer runs every answer through, on a small document: each kind of
 * mismatch it must report, and the answers it must let through.
 */
const json = (schema: unknown) => ({ content: { 'application/json': { schema } } })
const doc = {
  openapi: '3.1.0',
  paths: {
    '/v1/things/{id}': {
      get: {
        responses: {
          200: json({ type: 'object', required: ['id'], properties: { id: { type: 'string' } } }),
          404: json(ErrorBodySchema),
        },
      },
    },
    '/v1/things/{id}/old-run': {
      // As the document described streams before: the events' schema as the whole body's.
      post: { responses: { 200: { content: { 'text/event-stream': { schema: StreamEventSchema } } } } },
    },
    '/v1/things/special': { get: { responses: { 200: json({ type: 'object', required: ['special'] }) } } },
    '/v1/things/{id}/run': {
      post: {
        responses: {
          200: {
            content: {
              'text/event-stream': { schema: { type: 'string' }, 'x-cairn-event-data': StreamEventSchema },
            },
          },
          '4XX': json(ErrorBodySchema),
        },
      },
    },
  },
}
const checker = new OpenApiConformance(doc)
const body = (value: unknown) => Buffer.from(typeof value === 'string' ? value : JSON.stringify(value))
const op = (method: string, path: string) => {
  const found = checker.match(method, path)
  if (!found) throw new Error(`no operation for ${method} ${path}`)
  return found
}
const sse = (...events: [string, unknown][]) =>
  body(events.map(([name, data]) => `event: ${name}\ndata: ${JSON.stringify(data)}\n\n`).join(''))
const started = {
  type: 'run.started',
  sessionId: 's',
  turnId: 't',
  turn: 1,
  sandboxId: 'x',
  coldStart: false,
}
const completed = { type: 'run.completed', turnId: 't', text: 'hi', durationMs: 3 }

describe('OpenAPI conformance checker', () => {
  it('matches paths as the router does: a literal segment before a parameter, an empty one to a parameter', () => {
    expect(op('GET', '/v1/things/special').template).toBe('/v1/things/special')
    expect(op('GET', '/v1/things/abc').template).toBe('/v1/things/{id}')
    expect(op('GET', '/v1/things/').template).toBe('/v1/things/{id}')
    expect(checker.match('DELETE', '/v1/things/abc')).toBeUndefined()
    expect(checker.match('GET', '/v1/other')).toBeUndefined()
  })

  it('lets documented answers through', () => {
    const thing = op('GET', '/v1/things/abc')
    expect(checker.check(thing, 200, 'application/json; charset=utf-8', body({ id: 'abc' }))).toBeUndefined()
    const error = { error: { code: 'not_found', message: 'm', requestId: 'req_1' } }
    expect(checker.check(thing, 404, 'application/json', body(error))).toBeUndefined()
    const run = op('POST', '/v1/things/abc/run')
    expect(
      checker.check(
        run,
        200,
        'text/event-stream',
        sse(['run.started', started], ['run.completed', completed]),
      ),
    ).toBeUndefined()
    expect(checker.check(run, 409, 'application/json', body(error))).toBeUndefined()
  })

  it('reports an undocumented status, media type or body', () => {
    const thing = op('GET', '/v1/things/abc')
    expect(checker.check(thing, 400, 'application/json', body({}))).toContain('status not documented')
    expect(checker.check(thing, 200, 'text/plain', body('abc'))).toContain(
      'media type "text/plain" not documented',
    )
    expect(checker.check(thing, 200, 'application/json', body({ id: 1 }))).toContain(
      'does not match its schema',
    )
    expect(checker.check(thing, 200, 'application/json', body('{'))).toContain('not JSON')
    expect(checker.check(thing, 404, 'application/json', body({ message: 'x' }))).toContain('does not match')
  })

  it('reports an SSE event that is unknown, misnamed or off its schema', () => {
    const run = op('POST', '/v1/things/abc/run')
    expect(checker.check(run, 200, 'text/event-stream', sse(['surprise', { type: 'surprise' }]))).toContain(
      'event "surprise" is not documented',
    )
    expect(checker.check(run, 200, 'text/event-stream', sse(['run.completed', started]))).toContain(
      'event "run.completed" does not match',
    )
    expect(
      checker.check(
        run,
        200,
        'text/event-stream',
        sse(['run.completed', { ...completed, durationMs: 'slow' }]),
      ),
    ).toContain('does not match')
    expect(checker.check(run, 200, 'text/event-stream', body(''))).toContain('empty event stream')
  })

  it('reports a stream described by its events’ schema as if the stream were one event', () => {
    const old = op('POST', '/v1/things/abc/old-run')
    expect(checker.check(old, 200, 'text/event-stream', sse(['run.completed', completed]))).toContain(
      'the stream does not match its schema',
    )
  })
})
