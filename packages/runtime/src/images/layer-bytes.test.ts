import { execFileSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { gzipSync } from 'node:zlib'
import { afterAll, describe, expect, it } from 'vitest'
import { checkUnpackedLayerBytes } from './layer-bytes.js'

const dirs: string[] = []
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true })
})

/** An OCI layout whose tag `image` has the given layers (bytes already in their media type's encoding). */
function layout(layers: { mediaType: string; blob: Buffer }[]): string {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'cairn-layers-'))
  dirs.push(dir)
  mkdirSync(path.join(dir, 'blobs', 'sha256'), { recursive: true })
  const put = (bytes: Buffer) => {
    const hex = createHash('sha256').update(bytes).digest('hex')
    writeFileSync(path.join(dir, 'blobs', 'sha256', hex), bytes)
    return `sha256:${hex}`
  }
  const manifest = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      layers: layers.map((l) => ({ mediaType: l.mediaType, digest: put(l.blob), size: l.blob.length })),
    }),
  )
  const index = {
    schemaVersion: 2,
    manifests: [
      {
        mediaType: 'application/vnd.oci.image.manifest.v1+json',
        digest: put(manifest),
        size: manifest.length,
        annotations: { 'org.opencontainers.image.ref.name': 'image' },
      },
    ],
  }
  writeFileSync(path.join(dir, 'index.json'), JSON.stringify(index))
  return dir
}

const zstd = (bytes: Buffer) => execFileSync('zstd', ['-c', '-q'], { input: bytes })

describe('checkUnpackedLayerBytes', () => {
  const layers = [
    { mediaType: 'application/vnd.oci.image.layer.v1.tar', blob: Buffer.alloc(1000) },
    { mediaType: 'application/vnd.oci.image.layer.v1.tar+gzip', blob: gzipSync(Buffer.alloc(5000)) },
    { mediaType: 'application/vnd.oci.image.layer.v1.tar+zstd', blob: zstd(Buffer.alloc(3000)) },
    { mediaType: 'application/vnd.docker.image.rootfs.diff.tar.gzip', blob: gzipSync(Buffer.alloc(2000)) },
  ]

  it('sums what each layer decompresses to, whatever its encoding', async () => {
    expect(await checkUnpackedLayerBytes(layout(layers), 'image', 11_000)).toBe(11_000)
  })

  it('refuses layers that add up past the maximum, naming it', async () => {
    await expect(checkUnpackedLayerBytes(layout(layers), 'image', 10_999)).rejects.toMatchObject({
      code: 'build_failed',
      message: expect.stringMatching(/more than the operator's maximum/),
    })
  })

  it('refuses a layer of a media type it cannot read', async () => {
    const foreign = [
      { mediaType: 'application/vnd.oci.image.layer.v1.tar+encrypted', blob: Buffer.alloc(10) },
    ]
    await expect(checkUnpackedLayerBytes(layout(foreign), 'image', 1000)).rejects.toMatchObject({
      code: 'build_failed',
    })
  })
})
