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
interface ValidationIssue {
  instancePath: string
  schemaPath: string
  keyword: string
  params: Record<string, unknown>
  message?: string
  parentSchema?: { properties?: Record<string, unknown> }
}

/**
 * An unknown field is named, with the nearest known one (as cairn.yaml's keys are); any other
 * issue names its field and what it must be, a union's branches in one clause
 * (`body/policy/maxTurns must be integer or null`).
 */
function validationMessage(fallback: string, context: string | undefined, issues: ValidationIssue[]): string {
  const extra = issues.find((issue) => issue.keyword === 'additionalProperties')
  const key = extra?.params.additionalProperty
  if (extra === undefined || typeof key !== 'string') return issuesMessage(context, issues) ?? fallback
  const path = extra.instancePath.split('/').filter(Boolean).map(decodePointer)
  return unknownKeyMessage(
    { key, path, known: Object.keys(extra.parentSchema?.properties ?? {}) },
    'body',
    'field',
  )
}

function issuesMessage(context: string | undefined, issues: ValidationIssue[]): string | undefined {
  const byPlace = new Map<string, string[]>()
  for (const { keyword, instancePath, message } of issues) {
    // "must match a schema in anyOf" says nothing its branches' issues do not.
    if (keyword === 'anyOf' || message === undefined) continue
    byPlace.set(instancePath, [...(byPlace.get(instancePath) ?? []), message])
  }
  if (context === undefined || byPlace.size === 0) return undefined
  return [...byPlace]
    .map(([place, [first, ...rest]]) => {
      const alternatives = rest.map((m) => (first?.startsWith('must be ') ? m.replace(/^must be /, '') : m))
      return `${context}${place} ${[first, ...alternatives].join(' or ')}`
    })
    .join(', ')
}

function decodePointer(segment: string): string {
  return segment.replace(/~1/g, '/').replace(/~0/g, '~')
}

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
    const issues = fastifyError.validation as ValidationIssue[]
    return {
      status: 400,
      body: errorBody(
        'validation_failed',
        validationMessage(fastifyError.message, fastifyError.validationContext, issues),
        requestId,
        {
          // Without what verbose validation adds (the schema, the value): the issue, not an echo.
          issues: issues.map(({ instancePath, schemaPath, keyword, params, message }) => ({
            instancePath,
            schemaPath,
            keyword,
            params,
            message,
          })),
        },
      ),
    }
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

/** `bodyLimitOf` names the body limit that applies to a request (by its media type), for 413 answers. */
export function installErrorHandlers(
  app: FastifyInstance,
  bodyLimitOf?: (request: FastifyRequest) => BodyLimit,
): void {
  app.setErrorHandler((error, request, reply) => {
    const { status, body } = toErrorBody(error, request.id, bodyLimitOf?.(request))
    if (status >= 500) request.log.error({ err: error }, 'request failed')
    void reply.status(status).send(body)
  })
  app.setNotFoundHandler((request, reply) => {
    void reply
      .status(404)
      .send(errorBody('not_found', `no route for ${request.method} ${request.url.split('?')[0]}`, request.id))
  })
}

function formatMiB(bytes: number): string {
  const mib = bytes / 1024 / 1024
  return Number.isInteger(mib) ? `${mib} MiB` : `${mib.toFixed(2)} MiB`
}
