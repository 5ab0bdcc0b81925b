import { Readable } from 'node:stream'
import {
  CairnProblem,
  CreateSnapshotBody,
  DiffQuery,
  DiffSchema,
  FileEntrySchema,
  ForkBody,
  ForksBody,
  ForksResultSchema,
  IdParams,
  MergeBody,
  MergeResultSchema,
  OkSchema,
  RestoreBody,
  SessionManifestSchema,
  SessionSchema,
  SnapshotSchema,
  WorkspacePathQuery,
} from '@cairn/protocol'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { Type } from '@sinclair/typebox'
import type { FastifyInstance, FastifyReply } from 'fastify'
import { principalOf, requireWrite } from '../auth/plugin.js'
import { requestedPath } from '../files/confine.js'
import { bytesBody, bytesResponse, errorResponses } from '../http/responses.js'
import type { WorkspaceService } from './workspace-service.js'

// 429: at most a few digests and exports at once per tenant; 507: the workspace or tenant quota is full.
const errors = errorResponses(400, 401, 403, 404, 409, 410, 429, 507)
const idOf = (request: { params: { id: string } }) => request.params.id

/** Aborts when the client goes away before its answer is sent: the read behind it is stopped. */
function whileConnected(reply: FastifyReply): AbortSignal {
  const controller = new AbortController()
  reply.raw.once('close', () => {
    if (!reply.raw.writableFinished) controller.abort()
  })
  return controller.signal
}
const SnapshotQuery = Type.Object({
  digest: Type.Optional(Type.Boolean({ default: false })),
  /** Measure referenced and exclusive bytes (not stored: exclusive changes as other trees do). */
  sizes: Type.Optional(Type.Boolean({ default: false })),
})
const ManifestQuery = Type.Object({ sizes: Type.Optional(Type.Boolean({ default: false })) })
const SnapshotParams = Type.Object({
  id: Type.String({ minLength: 1, maxLength: 200 }),
  snapshotId: Type.String({ maxLength: 64 }),
})
const RestoreResult = Type.Object({ session: SessionSchema, snapshot: SnapshotSchema })
const ImportQuery = Type.Object({
  mode: Type.Optional(Type.Union([Type.Literal('replace'), Type.Literal('merge')], { default: 'replace' })),
})
const ImportResult = Type.Object({
  session: SessionSchema,
  /** Taken just before the import: restore it to undo the import. */
  snapshot: SnapshotSchema,
  fileCount: Type.Integer(),
  sizeBytes: Type.Integer(),
})

export function workspaceRoutes(server: FastifyInstance, workspace: WorkspaceService): void {
  const app = server.withTypeProvider<TypeBoxTypeProvider>()
  const tags = ['workspace']
  app.post(
    '/v1/sessions/:id/snapshots',
    {
      schema: {
        tags,
        summary:
          "Take a snapshot (sandbox frozen, O(1)); memory=true also keeps the running sandbox's memory for forks",
        params: IdParams,
        body: CreateSnapshotBody,
        response: { 201: SnapshotSchema, ...errors },
      },
    },
    async (request, reply) => {
      const body = request.body
      const info = await workspace.history.snapshot(
        requireWrite(request).tenantId,
        idOf(request),
        body.label,
        {
          memory: body.memory === true,
        },
      )
      return reply.status(201).send(info)
    },
  )
  app.get(
    '/v1/sessions/:id/snapshots',
    {
      schema: {
        tags,
        summary:
          'List snapshots (digest=true computes missing content digests, sizes=true measures referenced and exclusive bytes)',
        params: IdParams,
        querystring: SnapshotQuery,
        response: { 200: Type.Object({ data: Type.Array(SnapshotSchema) }), ...errors },
      },
    },
    async (request, reply) => ({
      data: await workspace.history.list(
        principalOf(request).tenantId,
        idOf(request),
        request.query,
        whileConnected(reply),
      ),
    }),
  )
  app.get(
    '/v1/sessions/:id/snapshots/:snapshotId',
    {
      schema: {
        tags,
        summary:
          'One snapshot (digest=true computes its content digest once, then it is stored; sizes=true measures its bytes)',
        params: SnapshotParams,
        querystring: SnapshotQuery,
        response: { 200: SnapshotSchema, ...errors },
      },
    },
    async (request, reply) => {
      const { id, snapshotId } = request.params
      return workspace.history.getSnapshot(
        principalOf(request).tenantId,
        id,
        snapshotId,
        request.query,
        whileConnected(reply),
      )
    },
  )
  app.delete(
    '/v1/sessions/:id/snapshots/:snapshotId',
    {
      schema: {
        tags,
        summary:
          'Delete a snapshot, freeing what it alone holds (409 snapshot_in_use while a restore, fork or export reads it)',
        params: SnapshotParams,
        response: { 200: OkSchema, ...errors },
      },
    },
    async (request) => {
      const { id, snapshotId } = request.params
      await workspace.history.deleteSnapshot(requireWrite(request).tenantId, id, snapshotId)
      return { ok: true }
    },
  )
  app.post(
    '/v1/sessions/:id/restore',
    {
      schema: {
        tags,
        summary: 'Replace the workspace with a snapshot (by ID or by the turn it follows)',
        params: IdParams,
        body: RestoreBody,
        response: { 200: RestoreResult, ...errors },
      },
    },
    async (request) => workspace.history.restore(requireWrite(request).tenantId, idOf(request), request.body),
  )
  app.post(
    '/v1/sessions/:id/undo',
    {
      schema: {
        tags,
        summary: 'Restore the workspace as it was before the last turn',
        params: IdParams,
        response: { 200: RestoreResult, ...errors },
      },
    },
    async (request) => workspace.history.undo(requireWrite(request).tenantId, idOf(request)),
  )
  app.post(
    '/v1/sessions/:id/fork',
    {
      schema: {
        tags,
        summary: 'A new session from a snapshot, with the transcript up to its turn',
        params: IdParams,
        body: ForkBody,
        response: { 201: SessionSchema, ...errors },
      },
    },
    async (request, reply) => {
      const info = await workspace.history.fork(requireWrite(request).tenantId, idOf(request), request.body)
      return reply.status(201).send(info)
    },
  )
  app.post(
    '/v1/sessions/:id/forks',
    {
      schema: {
        tags,
        summary:
          'Forks of the session as it is now (count, default 1), from one snapshot; memory: true also carries its running processes and memory',
        params: IdParams,
        body: ForksBody,
        response: { 201: ForksResultSchema, ...errors },
      },
    },
    async (request, reply) => {
      const result = await workspace.history.forks(
        requireWrite(request).tenantId,
        idOf(request),
        request.body,
      )
      return reply.status(201).send(result)
    },
  )
  app.post(
    '/v1/sessions/:id/merge',
    {
      schema: {
        tags,
        summary:
          "Merge a fork's changes since its fork point into its parent (or `into`, a session of the same agent); preview: true changes nothing",
        params: IdParams,
        body: MergeBody,
        response: { 200: MergeResultSchema, ...errors, ...errorResponses(413) },
      },
    },
    async (request) => {
      // A preview changes nothing: a read-only key may ask for one.
      const { tenantId } = request.body.preview ? principalOf(request) : requireWrite(request)
      return workspace.merges.merge(tenantId, idOf(request), request.body)
    },
  )
  app.get(
    '/v1/sessions/:id/files',
    {
      schema: {
        tags,
        summary:
          'List a workspace directory (413 payload_too_large past 50,000 entries or 16 MiB of their paths)',
        params: IdParams,
        querystring: WorkspacePathQuery,
        response: {
          200: Type.Object({ data: Type.Array(FileEntrySchema) }),
          ...errors,
          ...errorResponses(413),
        },
      },
    },
    async (request, reply) => {
      const q = request.query
      return {
        data: await workspace.files.listFiles(
          principalOf(request).tenantId,
          idOf(request),
          requestedPath(q),
          q.snapshot,
          { signal: whileConnected(reply) },
        ),
      }
    },
  )
  app.get(
    '/v1/sessions/:id/files/content',
    {
      schema: {
        tags,
        summary: 'Download a file (streamed)',
        params: IdParams,
        querystring: WorkspacePathQuery,
        response: { 200: bytesResponse('application/octet-stream', 'The file'), ...errors },
      },
    },
    async (request, reply) => {
      const q = request.query
      const file = await workspace.files.openFile(
        principalOf(request).tenantId,
        idOf(request),
        requestedPath(q),
        q.snapshot,
        { signal: whileConnected(reply) },
      )
      const stream = file.stream
      void reply.header('content-length', file.size)
      void reply.header('content-disposition', `attachment; filename="${encodeURIComponent(file.name)}"`)
      return reply.type('application/octet-stream').send(stream)
    },
  )
  app.put(
    '/v1/sessions/:id/files/content',
    {
      schema: {
        tags,
        summary: 'Upload a file (body: the raw bytes)',
        params: IdParams,
        querystring: WorkspacePathQuery,
        body: bytesBody(['application/octet-stream', 'text/plain'], 'The raw bytes of the file'),
        response: { 200: OkSchema, ...errors },
      },
    },
    async (request) => {
      const q = request.query
      const body = Buffer.isBuffer(request.body)
        ? request.body
        : Buffer.from(typeof request.body === 'string' ? request.body : '')
      await workspace.files.writeFile(
        requireWrite(request).tenantId,
        idOf(request),
        q.path ?? '',
        Readable.from([body]),
      )
      return { ok: true }
    },
  )
  app.delete(
    '/v1/sessions/:id/files',
    {
      schema: {
        tags,
        summary: 'Delete a file or directory',
        params: IdParams,
        querystring: WorkspacePathQuery,
        response: { 200: OkSchema, ...errors },
      },
    },
    async (request) => {
      await workspace.files.deleteFile(
        requireWrite(request).tenantId,
        idOf(request),
        request.query.path ?? '',
      )
      return { ok: true }
    },
  )
  app.get(
    '/v1/sessions/:id/diff',
    {
      schema: {
        tags,
        summary: 'Files added, changed and deleted since the revision or a snapshot',
        params: IdParams,
        querystring: DiffQuery,
        response: { 200: DiffSchema, ...errors },
      },
    },
    async (request, reply) =>
      workspace.files.diff(principalOf(request).tenantId, idOf(request), request.query.from, {
        signal: whileConnected(reply),
      }),
  )
  app.get(
    '/v1/sessions/:id/export',
    {
      schema: {
        tags,
        summary: 'The workspace (or a snapshot) as a tar.gz stream',
        params: IdParams,
        querystring: Type.Object({ snapshot: Type.Optional(Type.String()) }),
        response: { 200: bytesResponse('application/gzip', 'The workspace as tar.gz'), ...errors },
      },
    },
    async (request, reply) => {
      const id = idOf(request)
      const { stream, cleanup } = await workspace.archive.export(
        principalOf(request).tenantId,
        id,
        request.query.snapshot,
      )
      stream.once('close', () => void cleanup())
      stream.once('error', () => void cleanup())
      // tar's stream ends without a 'close': the response's close (sent or aborted) is what says
      // the export is done (its temporary snapshot removed, its snapshot unpinned).
      reply.raw.once('close', () => void cleanup())
      void reply.header('content-disposition', `attachment; filename="${id}.tar.gz"`)
      return reply.type('application/gzip').send(stream)
    },
  )
  app.put(
    '/v1/sessions/:id/workspace',
    {
      schema: {
        tags,
        summary:
          'Import a tar.gz as the workspace (mode=merge: unpack over it); checked like a deploy, undoable',
        params: IdParams,
        querystring: ImportQuery,
        body: bytesBody(['application/gzip'], 'The workspace as a tar.gz archive'),
        response: { 200: ImportResult, ...errors, ...errorResponses(413, 415) },
      },
    },
    async (request) => {
      const { tenantId } = requireWrite(request)
      if (!Buffer.isBuffer(request.body)) {
        throw new CairnProblem(
          'unsupported_media_type',
          'send the workspace as a tar.gz body (Content-Type: application/gzip)',
        )
      }
      const { mode } = request.query
      return workspace.archive.import(tenantId, idOf(request), request.body, mode)
    },
  )
  app.get(
    '/v1/sessions/:id/manifest',
    {
      schema: {
        tags,
        summary:
          'Revision, environment, snapshots, last turn, dirty files, limits and policies (sizes=true measures the workspace)',
        params: IdParams,
        querystring: ManifestQuery,
        response: { 200: SessionManifestSchema, ...errors },
      },
    },
    async (request) =>
      workspace.manifest.build(principalOf(request).tenantId, idOf(request), request.query.sizes),
  )
}
