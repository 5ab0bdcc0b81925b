import { maxHeaderSize, STATUS_CODES } from 'node:http'
import type { Socket } from 'node:net'
import {
  CairnProblem,
  ERROR_STATUS,
  type ErrorBody,
  type ErrorCode,
  isErrorCode,
  unknownKeyMessage,
} from '@cairn/protocol'
import type { FastifyError, FastifyInstance, FastifyRequest } from 'fastify'
import { NO_ANSWER, unavailableReason } from '../db/busy.js'
import { RouteMethods } from './route-methods.js'

/** The ID every answer's error carries (`requestId`) and the logs name. */
export function newRequestId(): string {
  return `req_${Math.random().toString(36).slice(2, 12)}`
}

export function errorBody(
  code: ErrorCode,
  message: string,
  requestId?: string,
  details?: Record<string, unknown>,
): ErrorBody {
  return {
    error: {
      code,
      message,
      ...(requestId === undefined ? {} : { requestId }),
      ...(details === undefined ? {} : { details }),
    },
  }
}

/** The most bytes a request body may have, and which bodies it applies to ("JSON bodies", "uploads"). */
export interface BodyLimit {
  bytes: number
  applies: string
}

/** One validation issue as Ajv reports it (`verbose`: with the schema that holds it). */
export interface ValidationIssue {
  instancePath: string
  schemaPath: string
  keyword: string
  params: Record<string, unknown>
  message?: string
  parentSchema?: { properties?: Record<string, unknown> }
}

/** Where a validation context's fields are, as an unknown field's message names it. */
const PLACES: Readonly<Record<string, string>> = {
  body: 'body',
  querystring: 'the query string',
  params: 'the path',
  headers: 'the headers',
  arguments: 'arguments',
}

/**
 * An unknown field is named, with the nearest known one (as cairn.yaml's keys are); any other
 * issue names its field and what it must be, a union's branches in one clause
 * (`body/policy/maxTurns must be integer or null`).
 */
function validationMessage(
  fallback: string,
  context: string | undefined,
  issues: readonly ValidationIssue[],
): string {
  const extra = issues.find((issue) => issue.keyword === 'additionalProperties')
  const key = extra?.params.additionalProperty
  if (extra === undefined || typeof key !== 'string') return issuesMessage(context, issues) ?? fallback
  const path = extra.instancePath.split('/').filter(Boolean).map(decodePointer)
  return unknownKeyMessage(
    { key, path, known: Object.keys(extra.parentSchema?.properties ?? {}) },
    PLACES[context ?? 'body'] ?? 'body',
    'field',
  )
}

function issuesMessage(context: string | undefined, issues: readonly ValidationIssue[]): string | undefined {
  const byPlace = new Map<string, string[]>()
  for (const { keyword, instancePath, message, params } of issues) {
    // "must match a schema in anyOf" says nothing its branches' issues do not.
    if (keyword === 'anyOf' || message === undefined) continue
    // A union of values names them ("must be equal to constant" named none), each said once.
    const said = keyword === 'const' ? `must be ${quoted(params.allowedValue)}` : message
    const place = byPlace.get(instancePath) ?? []
    if (!place.includes(said)) byPlace.set(instancePath, [...place, said])
  }
  if (context === undefined || byPlace.size === 0) return undefined
  return [...byPlace]
    .map(([place, [first, ...rest]]) => {
      const alternatives = rest.map((m) => m.slice(sharedWords(first ?? '', m).length))
      return `${context}${place} ${[first, ...alternatives].join(' or ')}`
    })
    .join(', ')
}

function quoted(value: unknown): string {
  return typeof value === 'string' ? `'${value}'` : JSON.stringify(value)
}

/** The words two messages start with (`must be `, `must have required property `), with the space after them. */
function sharedWords(a: string, b: string): string {
  let n = 0
  while (n < a.length && a[n] === b[n]) n++
  return a.slice(0, a.lastIndexOf(' ', n - 1) + 1)
}

function decodePointer(segment: string): string {
  return segment.replace(/~1/g, '/').replace(/~0/g, '~')
}

/**
 * Ajv's issues as a `validation_failed` problem: the message names the field at fault (`context`
 * is where the value came from: `body`, `querystring`, an MCP tool's `arguments`), the details
 * list the issues without what verbose validation adds (the schema, the value): the issue, not an echo.
 */
export function validationProblem(
  issues: readonly ValidationIssue[],
  context: string | undefined,
  fallback: string,
): CairnProblem {
  return new CairnProblem('validation_failed', validationMessage(fallback, context, issues), {
    issues: issues.map(({ instancePath, schemaPath, keyword, params, message }) => ({
      instancePath,
      schemaPath,
      keyword,
      params,
      message,
    })),
  })
}

/** The body an error is answered with, for the API the request was made to. */
export type ErrorShape = (request: FastifyRequest, body: ErrorBody) => unknown

/** Maps anything thrown by a handler to the registry's error shape and status. */
export function toErrorBody(
  error: unknown,
  requestId: string,
  bodyLimit?: BodyLimit,
): { status: number; body: ErrorBody } {
  if (error instanceof CairnProblem) {
    return { status: error.status, body: errorBody(error.code, error.message, requestId, error.details) }
  }
  const fastifyError = error as FastifyError & { validation?: unknown; validationContext?: string }
  if (fastifyError?.validation) {
    const problem = validationProblem(
      fastifyError.validation as ValidationIssue[],
      fastifyError.validationContext,
      fastifyError.message,
    )
    return { status: 400, body: errorBody(problem.code, problem.message, requestId, problem.details) }
  }
  switch (fastifyError?.code) {
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return { status: 400, body: errorBody('invalid_json', 'request body is not valid JSON', requestId) }
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return {
        status: 413,
        body: errorBody(
          'payload_too_large',
          bodyLimit === undefined
            ? fastifyError.message
            : `request body is larger than the limit of ${bodyLimit.bytes} bytes (${formatMiB(bodyLimit.bytes)}) for ${bodyLimit.applies}`,
          requestId,
          bodyLimit === undefined ? undefined : { limitBytes: bodyLimit.bytes },
        ),
      }
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return { status: 415, body: errorBody('unsupported_media_type', fastifyError.message, requestId) }
  }
  if (fastifyError instanceof SyntaxError || fastifyError?.statusCode === 400) {
    return { status: 400, body: errorBody('bad_request', fastifyError.message, requestId) }
  }
  const code = (error as { code?: unknown })?.code
  // SQLite still locked by another writer after busy_timeout, PostgreSQL restarting or its
  // connection dropped: a retryable condition, not a bug (a transaction left nothing behind).
  const unavailable = unavailableReason(error)
  if (unavailable) {
    // A statement that went unanswered may still be applied when the database comes back.
    const outcome = unavailable.startsWith(NO_ANSWER) ? 'try again' : 'nothing was changed, try again'
    return {
      status: ERROR_STATUS.unavailable,
      body: errorBody('unavailable', `${unavailable}; ${outcome}`, requestId, {
        reason: String(code),
      }),
    }
  }
  if (isErrorCode(code))
    return { status: ERROR_STATUS[code], body: errorBody(code, String(fastifyError.message), requestId) }
  return { status: 500, body: errorBody('internal', 'internal error', requestId) }
}

/**
 * `bodyLimitOf` names the body limit that applies to a request (by its media type), for 413
 * answers; `shape` turns an error body into the shape the request's API answers in (the compat
 * API's, under its prefix).
 */
export function installErrorHandlers(
  app: FastifyInstance,
  bodyLimitOf?: (request: FastifyRequest) => BodyLimit,
  shape: ErrorShape = (_request, body) => body,
): void {
  app.setErrorHandler((error, request, reply) => {
    const { status, body } = toErrorBody(error, request.id, bodyLimitOf?.(request))
    if (status >= 500) request.log.error({ err: error }, 'request failed')
    void reply.status(status).send(shape(request, body))
  })
  const routes = new RouteMethods(app)
  app.setNotFoundHandler((request, reply) => {
    const pathname = request.url.split('?')[0] ?? ''
    const allowed = routes.allowed(pathname)
    if (allowed.length === 0) {
      void reply
        .status(404)
        .send(
          shape(request, errorBody('not_found', `no route for ${request.method} ${pathname}`, request.id)),
        )
      return
    }
    void reply
      .status(405)
      .header('allow', allowed.join(', '))
      .send(
        shape(
          request,
          errorBody(
            'method_not_allowed',
            `${pathname} does not take ${request.method}; it takes ${allowed.join(', ')}`,
            request.id,
            { allow: allowed },
          ),
        ),
      )
  })
}

/** What the HTTP parser refuses before any route sees the request, by Node's error code. */
const CLIENT_ERRORS: Record<string, { code: ErrorCode; message: string }> = {
  HPE_HEADER_OVERFLOW: {
    code: 'headers_too_large',
    message: `the request line and headers are larger than the server reads (${maxHeaderSize} bytes in all)`,
  },
  ERR_HTTP_REQUEST_TIMEOUT: {
    code: 'request_timeout',
    message: 'the request was not received in time; nothing was done',
  },
}

/**
 * Answers a request the HTTP parser refused (headers too large, a request too slow, bytes that are
 * not HTTP) in the registry's shape, as every other error, and closes the connection (Fastify's
 * own answer to these has a shape of its own). Nothing reached a route, so nothing was done.
 */
export function answerClientError(error: NodeJS.ErrnoException, socket: Socket): void {
  if (error.code === 'ECONNRESET' || socket.destroyed) return
  const known = CLIENT_ERRORS[error.code ?? '']
  const code = known?.code ?? 'bad_request'
  const message = known?.message ?? 'the request is not valid HTTP'
  const body = JSON.stringify(errorBody(code, message, newRequestId()))
  const status = ERROR_STATUS[code]
  if (socket.writable)
    socket.write(
      `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? 'Error'}\r\nContent-Type: application/json; charset=utf-8\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    )
  socket.destroy(error)
}

function formatMiB(bytes: number): string {
  const mib = bytes / 1024 / 1024
  return Number.isInteger(mib) ? `${mib} MiB` : `${mib.toFixed(2)} MiB`
}
