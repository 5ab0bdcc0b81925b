import type { FastifyInstance, FastifyRequest } from 'fastify'

/**
 * An empty body is no body, whatever `Content-Type` says (many clients send one on every request,
 * body-less ones included: end, resume, delete …). A request with `Content-Length: 0` is handled as
 * one without a body (no parser runs, so no `invalid_json` and no `415` for an empty form); an
 * empty chunked JSON body is the JSON parser's (app.ts). `passThrough` requests (previews, relayed
 * to a sandbox's service as they came) are left alone.
 *
 * Then a request with no body to a route whose body schema is an object with no required field is
 * that empty object, so a bare `POST …/snapshots` or `POST …/resume` works. A route that needs a
 * field still answers `validation_failed` naming it, and a body of literal `null` answers
 * `validation_failed` everywhere (it is not an object).
 */
export function acceptEmptyBodies(
  app: FastifyInstance,
  passThrough: (request: FastifyRequest) => boolean,
): void {
  app.addHook('onRequest', async (request) => {
    const headers = request.raw.headers
    if (
      headers['content-type'] !== undefined &&
      headers['content-length'] === '0' &&
      headers['transfer-encoding'] === undefined &&
      !passThrough(request)
    ) {
      delete headers['content-type']
    }
  })
  app.addHook('preValidation', async (request) => {
    // Only an absent body is the empty object: a JSON `null` is a body, and a wrong one.
    if (request.body !== undefined) return
    const schema = request.routeOptions.schema?.body as { type?: unknown; required?: unknown[] } | undefined
    if (schema?.type === 'object' && (schema.required ?? []).length === 0) request.body = {}
  })
}
