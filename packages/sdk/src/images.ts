import { checked } from './guards.js'
import type { HttpClient, RequestOptions } from './http.js'
import * as valid from './validators.js'

/** A built image: a read-only root shared by the revisions whose `image:` names it. */
export interface ImageSummary {
  key: string
  kind: 'debian' | 'oci'
  /** The Debian recipe or the OCI reference pulled. */
  source: string
  /** The OCI manifest digest, or the sha256 of a Debian recipe. */
  digest: string
  sizeBytes: number
  builtAt: string
  buildMs: number
  /** The caller's revisions that run on it. */
  revisions: { id: string; agentId: string }[]
}

/** Built agent images (`GET /v1/images`). */
export class Images {
  constructor(private readonly http: HttpClient) {}

  /** Every built image, oldest first, and the operator's default image (`host`: the host's /usr). */
  async list(options: RequestOptions = {}): Promise<{ images: ImageSummary[]; defaultImage: string }> {
    const body = await this.http.json({ method: 'GET', path: '/v1/images', ...options })
    const list = checked(valid.ImageList, body, 'image list')
    return {
      defaultImage: list.defaultImage,
      images: list.data.map(({ key, kind, source, digest, sizeBytes, builtAt, buildMs, revisions }) => ({
        key,
        kind,
        source,
        digest,
        sizeBytes,
        builtAt,
        buildMs,
        revisions: revisions.map(({ id, agentId }) => ({ id, agentId })),
      })),
    }
  }
}
