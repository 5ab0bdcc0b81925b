import { type Static, Type } from '@sinclair/typebox'

/** A built image: a read-only root filesystem shared by every revision whose `image:` names it. */
export const ImageSchema = Type.Object({
  /** `debian-<recipe hash>` or `oci-<manifest digest hex>`. */
  key: Type.String(),
  kind: Type.Union([Type.Literal('debian'), Type.Literal('oci')]),
  /** The recipe (`debian:bookworm + git, ripgrep from <mirror>`) or the OCI reference pulled. */
  source: Type.String(),
  /** The OCI manifest digest, or for a Debian image the sha256 of its recipe. */
  digest: Type.String(),
  sizeBytes: Type.Integer(),
  builtAt: Type.String(),
  buildMs: Type.Integer(),
  /** Revisions (of the caller's tenant) whose sandboxes run on it. */
  revisions: Type.Array(Type.Object({ id: Type.String(), agentId: Type.String() })),
})
export type ImageInfo = Static<typeof ImageSchema>

export const ImageListSchema = Type.Object({
  data: Type.Array(ImageSchema),
  /** The image of agents whose cairn.yaml names none (`host`: the host's /usr, read-only). */
  defaultImage: Type.String(),
})
export type ImageList = Static<typeof ImageListSchema>
