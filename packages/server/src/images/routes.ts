import { ImageListSchema } from '@cairn/protocol'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import type { FastifyInstance } from 'fastify'
import { principalOf } from '../auth/plugin.js'
import { errorResponses } from '../http/responses.js'
import type { ImageService } from './image-service.js'

const errors = errorResponses(401, 403)

export function imageRoutes(server: FastifyInstance, images: ImageService): void {
  const app = server.withTypeProvider<TypeBoxTypeProvider>()
  app.get(
    '/v1/images',
    {
      schema: {
        tags: ['agents'],
        summary:
          "The built images the tenant's revisions run on (Debian recipes and pulled OCI images): size, recipe or digest, and those revisions",
        response: { 200: ImageListSchema, ...errors },
      },
    },
    async (request) => images.list(principalOf(request).tenantId),
  )
}
