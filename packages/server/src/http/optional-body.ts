import type { FastifyInstance } from 'fastify'

/**
 * A request with no body (or an empty one: see the JSON parser in app.ts) to a route whose body
 * schema is an object with no required field is that empty object, so a bare `POST …/snapshots`
 * or `POST …/resume` works however the client sets its headers. A route that needs a field still
 * answers `validation_failed` naming it.
 */
export function acceptAbsentOptionalBodies(app: FastifyInstance): void {
  app.addHook('preValidation', async (request) => {
    if (request.body !== undefined && request.body !== null) return
    const schema = request.routeOptions.schema?.body as { type?: unknown; required?: unknown[] } | undefined
    if (schema?.type === 'object' && (schema.required ?? []).length === 0) request.body = {}
  })
}
