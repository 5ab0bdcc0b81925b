import { spawn } from 'node:child_process'
import { createReadStream } from 'node:fs'
import { readFile } from 'node:fs/promises'
import path from 'node:path'
import type { Readable } from 'node:stream'
import { createGunzip } from 'node:zlib'
import { CairnProblem } from '@cairn/protocol'
import { OWN_PROCESS_GROUP } from '../util/process-group.js'

interface Descriptor {
  mediaType?: string
  digest: string
  annotations?: Record<string, string>
}

function blobPath(layout: string, digest: string): string {
  const match = /^sha256:([0-9a-f]{64})$/.exec(digest)
  if (!match?.[1])
    throw new CairnProblem('build_failed', `the image names a blob '${digest}' that is not a sha256 digest`)
  return path.join(layout, 'blobs', 'sha256', match[1])
}

/** The layer's tar stream, decompressed as its media type says. */
function tarStream(blob: string, mediaType: string): Readable {
  if (/(\+|\.)gzip$/.test(mediaType)) {
    const file = createReadStream(blob)
    return file.pipe(createGunzip()).once('close', () => file.destroy())
  }
  if (/\+zstd$/.test(mediaType)) {
    const child = spawn('zstd', ['-dcq', blob], {
      stdio: ['ignore', 'pipe', 'ignore'],
      ...OWN_PROCESS_GROUP,
    })
    return child.stdout.once('close', () => child.kill('SIGKILL'))
  }
  if (/(\.tar|\+tar|layer\.v1\.tar)$/.test(mediaType)) return createReadStream(blob)
  throw new CairnProblem(
    'build_failed',
    `the image has a layer of media type '${mediaType}', which is not unpacked`,
  )
}

/** Bytes of `stream` counted up to `limit`: past it the stream is stopped and undefined returned. */
function countUpTo(stream: Readable, limit: number): Promise<number | undefined> {
  return new Promise((resolve, reject) => {
    let bytes = 0
    stream.on('data', (chunk: Buffer) => {
      bytes += chunk.length
      if (bytes > limit) {
        stream.destroy()
        resolve(undefined)
      }
    })
    stream.on('end', () => resolve(bytes))
    stream.on('error', reject)
  })
}

/**
 * Refuses, before anything is unpacked, an OCI image (the `tag` of the layout at `layout`) whose
 * layers' tar streams add up to more than `maxBytes`: a compressed layer of zeros, a few MiB
 * pulled, would otherwise fill the pool with gigabytes before the root's size is measured. The sum
 * bounds what unpacking writes at its peak (a later layer's deletions free space only after).
 */
export async function checkUnpackedLayerBytes(
  layout: string,
  tag: string,
  maxBytes: number,
): Promise<number> {
  const index = JSON.parse(await readFile(path.join(layout, 'index.json'), 'utf8')) as {
    manifests?: Descriptor[]
  }
  const entry =
    index.manifests?.find((m) => m.annotations?.['org.opencontainers.image.ref.name'] === tag) ??
    index.manifests?.[0]
  if (!entry) throw new CairnProblem('build_failed', 'the pulled image has no manifest')
  const manifest = JSON.parse(await readFile(blobPath(layout, entry.digest), 'utf8')) as {
    layers?: Descriptor[]
  }
  let total = 0
  for (const layer of manifest.layers ?? []) {
    const stream = tarStream(blobPath(layout, layer.digest), layer.mediaType ?? '')
    const bytes = await countUpTo(stream, maxBytes - total)
    if (bytes === undefined)
      throw new CairnProblem(
        'build_failed',
        `the image's layers unpack to more than the operator's maximum of ${(maxBytes / 1024 / 1024).toFixed(1)} MiB (--max-image-mib); nothing was unpacked`,
      )
    total += bytes
  }
  return total
}
