import { createHash, randomBytes } from 'node:crypto'
import { lstat, mkdir, readdir, rm, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import type { EgressSite } from '../egress/proxy.js'
import { STATX_PRELOAD_PATH, STATX_SHIM_PATH } from '../sandbox/gvisor-statx-fix.js'
import { generatedEtcFiles } from '../sandbox/rootfs.js'
import { execTool } from '../util/exec.js'
import { debianImageKey, describeRecipe, type ImageRecipe, ociImageKey } from './image-recipe.js'
import type { ImageStore } from './image-store.js'
import { ImagesAdmissions, namedImagesFailure } from './images-room.js'
import { checkUnpackedLayerBytes } from './layer-bytes.js'
import { runProxied } from './proxied-command.js'
import { checkDeclaredBytes, platformManifestDigest, watchTreeBytes } from './pull-bounds.js'

export interface ImageBuildContext {
  log: (line: string) => void
  timeoutMs: number
}

export interface ImageBuilderOptions {
  store: ImageStore
  /** The shared sandbox uid/gid: an image's files are handed to it (see `prepareRoot`). */
  hostUid: number
  hostGid: number
  egressSite?: EgressSite | undefined
  /**
   * Largest root a build or pull may leave (images are shared and outside every tenant's quota, so
   * a recipe of many packages or a huge OCI image is refused here; default 4 GiB).
   */
  maxBytes?: number | undefined
}

/** Where a sandbox mounts what the runtime brings: made in every image (gVisor's gofer cannot make them in a read-only root). */
const MOUNT_POINTS = [
  'workspace',
  'run/cairn',
  'tmp',
  'proc',
  'dev',
  'opt/cairn',
  'env',
  'node_modules',
  'memory',
  'src',
]

/**
 * Makes `relative` (a path under `rootfs`) a real directory, component by component: a symlink or a
 * file in its place is replaced, since a symlink would resolve on the host, outside the image.
 */
async function realDirectory(rootfs: string, relative: string): Promise<string> {
  let at = rootfs
  for (const part of relative.split('/')) {
    at = path.join(at, part)
    const info = await lstat(at).catch(() => undefined)
    if (info?.isDirectory()) continue
    if (info) await rm(at, { recursive: true, force: true })
    await mkdir(at, { mode: 0o755 })
  }
  return at
}

/** Whether every component of `relative` under `rootfs` is a real directory (no symlink). */
async function isRealDirectory(rootfs: string, relative: string): Promise<boolean> {
  let at = rootfs
  for (const part of relative.split('/')) {
    at = path.join(at, part)
    const info = await lstat(at).catch(() => undefined)
    if (!info?.isDirectory()) return false
  }
  return true
}

const DEFAULT_MAX_IMAGE_BYTES = 4096 * 1024 * 1024

function mebibytes(bytes: number): string {
  return (bytes / 1024 / 1024).toFixed(1)
}

function hostOf(url: string): string {
  const parsed = new URL(url)
  return parsed.port ? `${parsed.hostname}:${parsed.port}` : parsed.hostname
}

/**
 * Builds (or finds) the image of a recipe: a Debian base with mmdebstrap from the operator's
 * mirror, or an OCI image pulled with skopeo and unpacked with umoci. Each runs as root in a
 * network namespace whose only way out is the egress proxy, allowed the mirror or registry alone.
 */
export class ImageBuilder {
  /** Builds under way per key: a second revision with the same recipe waits for the first. */
  private readonly building = new Map<string, Promise<string>>()
  /** Room held for images admitted at deploy and not yet built. */
  private readonly admissions = new ImagesAdmissions()

  constructor(private readonly options: ImageBuilderOptions) {}

  private get maxBytes(): number {
    return this.options.maxBytes ?? DEFAULT_MAX_IMAGE_BYTES
  }

  /**
   * The key of `recipe`'s image, without building it: a Debian recipe's hash, or the digest an OCI
   * reference names now (asked of its registry); undefined for the host's /usr.
   */
  async keyOf(recipe: ImageRecipe, ctx: ImageBuildContext): Promise<string | undefined> {
    if (recipe.kind === 'host') return undefined
    const { store } = this.options
    if (recipe.kind === 'debian') {
      const key = debianImageKey(recipe)
      if (!store.has(key))
        await this.admissions.admit(store, key, 0, `the build of ${describeRecipe(recipe)}`)
      return key
    }
    const digest = await this.resolveDigest(recipe.reference, ctx)
    const key = ociImageKey(digest)
    if (!store.has(key)) {
      const declaredBytes = await this.checkDeclaredSize(recipe.reference, digest, ctx)
      // A pull holds its layers as downloaded and their unpacked tree (at least as large) at once.
      await this.admissions.admit(store, key, 2 * declaredBytes, `the pull of ${recipe.reference}`)
    }
    return key
  }

  /**
   * Refuses, before any layer is downloaded, an image whose manifest (for this host's platform,
   * when the digest names an index) declares more bytes than the operator's maximum.
   */
  private async checkDeclaredSize(
    reference: string,
    digest: string,
    ctx: ImageBuildContext,
  ): Promise<number> {
    const repository = repositoryOf(reference)
    let manifest = await this.rawManifest(`${repository}@${digest}`, reference, ctx)
    const platform = platformManifestDigest(manifest)
    if (platform) manifest = await this.rawManifest(`${repository}@${platform}`, reference, ctx)
    return checkDeclaredBytes(manifest, this.maxBytes)
  }

  /** The manifest `byDigest` names, as its registry serves it. */
  private async rawManifest(byDigest: string, reference: string, ctx: ImageBuildContext) {
    const lines: string[] = []
    await runProxied({
      command: ['skopeo', 'inspect', '--tls-verify=false', '--raw', `docker://${byDigest}`],
      allow: [registryOf(reference)],
      site: this.options.egressSite,
      timeoutMs: ctx.timeoutMs,
      log: (line) => lines.push(line),
    })
    try {
      return JSON.parse(lines.join('\n')) as Parameters<typeof checkDeclaredBytes>[0]
    } catch {
      throw new CairnProblem('build_failed', `the registry's manifest for ${reference} is not JSON`)
    }
  }

  /** Builds or pulls the image `key` of `recipe` unless it is built already; returns the key. */
  async ensure(recipe: ImageRecipe, key: string, ctx: ImageBuildContext): Promise<string> {
    if (recipe.kind === 'host') throw new CairnProblem('internal', 'the host image is not built')
    if (recipe.kind === 'debian') return this.once(key, ctx, () => this.buildDebian(key, recipe, ctx))
    const digest = `sha256:${key.slice('oci-'.length)}`
    return this.once(key, ctx, () => this.pullOci(key, recipe.reference, digest, ctx))
  }

  private async once(key: string, ctx: ImageBuildContext, build: () => Promise<void>): Promise<string> {
    const { store } = this.options
    if (store.has(key)) {
      ctx.log(`image: reusing ${key}`)
      return key
    }
    let pending = this.building.get(key)
    if (!pending) {
      this.admissions.pulling(key)
      pending = build()
        .then(() => key)
        .finally(() => {
          this.building.delete(key)
          this.admissions.release(key)
        })
      this.building.set(key, pending)
    } else ctx.log(`image: waiting for the build of ${key} under way`)
    return pending
  }

  private async buildDebian(
    key: string,
    recipe: Extract<ImageRecipe, { kind: 'debian' }>,
    ctx: ImageBuildContext,
  ): Promise<void> {
    const { store } = this.options
    const started = Date.now()
    ctx.log(`image: building ${key}: ${describeRecipe(recipe)}`)
    const staging = await store.createStaging(`imagebuild_${randomBytes(8).toString('hex')}`)
    try {
      const proxy = 'http://127.0.0.1:3128'
      await runProxied({
        command: [
          'mmdebstrap',
          '--mode=root',
          '--variant=minbase',
          '--format=directory',
          `--aptopt=Acquire::http::Proxy "${proxy}"`,
          `--aptopt=Acquire::https::Proxy "${proxy}"`,
          ...(recipe.packages.length ? [`--include=${recipe.packages.join(',')}`] : []),
          recipe.suite,
          path.join(staging, 'rootfs'),
          recipe.mirror,
        ],
        allow: [hostOf(recipe.mirror)],
        site: this.options.egressSite,
        timeoutMs: ctx.timeoutMs,
        log: ctx.log,
      })
      await this.prepareRoot(path.join(staging, 'rootfs'))
      const digest = `sha256:${createHash('sha256').update(JSON.stringify(recipe)).digest('hex')}`
      await this.sealImage(staging, key, 'debian', describeRecipe(recipe), digest, started, ctx)
    } catch (error) {
      const named = await namedImagesFailure(store, error, `the build of ${key}`)
      await store.discardStaging(staging).catch(() => undefined)
      throw named
    }
  }

  /**
   * The digest `reference` names, asked of its registry even when the reference pins one: images
   * are shared by digest across tenants, so a digest alone (another tenant's, read from a log or
   * guessed from a public image's rebuild) must not reuse a pulled root its registry does not hold.
   */
  private async resolveDigest(reference: string, ctx: ImageBuildContext): Promise<string> {
    const pinned = /@(sha256:[0-9a-f]{64})$/.exec(reference)?.[1]
    const lines: string[] = []
    await runProxied({
      command: [
        'skopeo',
        'inspect',
        '--tls-verify=false',
        '--format',
        '{{.Digest}}',
        `docker://${reference}`,
      ],
      allow: [registryOf(reference)],
      site: this.options.egressSite,
      timeoutMs: ctx.timeoutMs,
      log: (line) => {
        lines.push(line)
        if (!/^sha256:/.test(line)) ctx.log(line)
      },
    })
    const digest = lines.find((l) => /^sha256:[0-9a-f]{64}$/.test(l.trim()))?.trim()
    if (!digest) throw new CairnProblem('build_failed', `the registry named no digest for ${reference}`)
    if (pinned && digest !== pinned)
      throw new CairnProblem('build_failed', `the registry answered ${digest} for ${reference}`)
    return digest
  }

  private async pullOci(
    key: string,
    reference: string,
    digest: string,
    ctx: ImageBuildContext,
  ): Promise<void> {
    const { store } = this.options
    const started = Date.now()
    ctx.log(`image: pulling ${reference} (${digest})`)
    const staging = await store.createStaging(`imagepull_${randomBytes(8).toString('hex')}`)
    const byDigest = `${repositoryOf(reference)}@${digest}`
    const layout = path.join(staging, 'layout')
    // What the registry sends is measured as it lands (skopeo's temporary files included) and the
    // pull stopped at the cap, whatever the manifest declared.
    const watch = watchTreeBytes(staging, this.maxBytes, `the pull of ${reference}`)
    try {
      await runProxied({
        command: [
          'skopeo',
          'copy',
          '--src-tls-verify=false',
          '--quiet',
          `docker://${byDigest}`,
          `oci:${layout}:image`,
        ],
        allow: [registryOf(reference)],
        site: this.options.egressSite,
        env: { TMPDIR: staging },
        signal: watch.signal,
        timeoutMs: ctx.timeoutMs,
        log: ctx.log,
      }).finally(watch.stop)
      // No network from here: umoci reads the layout the pull wrote, once its layers are known to
      // fit under the cap (a small compressed layer can unpack to gigabytes).
      await checkUnpackedLayerBytes(layout, 'image', this.maxBytes)
      await execTool('umoci', ['raw', 'unpack', '--image', `${layout}:image`, path.join(staging, 'rootfs')], {
        code: 'build_failed',
        timeoutMs: ctx.timeoutMs,
      })
      await rm(layout, { recursive: true, force: true })
      await this.prepareRoot(path.join(staging, 'rootfs'))
      await this.sealImage(staging, key, 'oci', reference, digest, started, ctx)
    } catch (error) {
      const named = await namedImagesFailure(store, error, `the pull of ${reference}`)
      await store.discardStaging(staging).catch(() => undefined)
      throw named
    }
  }

  /**
   * Makes an unpacked root a sandbox root: device nodes removed, every file handed to the sandbox
   * uid (one uid is all a sandbox's user namespace maps; chown also drops setuid bits), the generated /etc files written
   * in, mount points made, and Debian's EXTERNALLY-MANAGED markers removed: the root resets with
   * each sandbox, so `pip install` into it cannot outlive the sandbox that ran it.
   */
  private async prepareRoot(rootfs: string): Promise<void> {
    // This runs as root on the host, over files an image's author chose: every directory written
    // into is made a real directory first, so a symlink in the image (`etc -> /etc`) cannot carry a
    // write out of the root.
    const etc = await realDirectory(rootfs, 'etc')
    for (const [name, body] of Object.entries(generatedEtcFiles())) {
      await rm(path.join(etc, name), { recursive: true, force: true })
      await writeFile(path.join(etc, name), body, { mode: 0o644 })
    }
    for (const point of MOUNT_POINTS) await realDirectory(rootfs, point)
    // Mount points of the statx shim the gVisor driver binds in for old runsc releases
    // (gvisor-statx-fix.ts): an empty /etc/ld.so.preload preloads nothing elsewhere. An image's own
    // non-empty one is kept, and the driver then leaves the shim out.
    const shim = path.join(
      await realDirectory(rootfs, path.dirname(STATX_SHIM_PATH).slice(1)),
      path.basename(STATX_SHIM_PATH),
    )
    await rm(shim, { recursive: true, force: true })
    await writeFile(shim, '', { mode: 0o644 })
    const preload = path.join(rootfs, STATX_PRELOAD_PATH)
    const preloadInfo = await lstat(preload).catch(() => undefined)
    if (!preloadInfo?.isFile()) {
      await rm(preload, { recursive: true, force: true })
      await writeFile(preload, '', { mode: 0o644 })
    }
    const lib = path.join(rootfs, 'usr', 'lib')
    if (await isRealDirectory(rootfs, 'usr/lib'))
      for (const name of await readdir(lib))
        if (/^python3(\.\d+)?$/.test(name) && (await isRealDirectory(rootfs, `usr/lib/${name}`)))
          await rm(path.join(lib, name, 'EXTERNALLY-MANAGED'), { force: true })
    // Device nodes an image brought (mmdebstrap's /dev, or an OCI layer's): a sandbox gets its own
    // /dev, and the overlay is nodev anyway; none stays in a root a tenant chose.
    await execTool('find', [rootfs, '-xdev', '(', '-type', 'b', '-o', '-type', 'c', ')', '-delete'], {
      code: 'storage_error',
      timeoutMs: 600_000,
    })
    await execTool(
      'chown',
      ['-R', '--no-dereference', `${this.options.hostUid}:${this.options.hostGid}`, rootfs],
      { code: 'storage_error', timeoutMs: 600_000 },
    )
  }

  private async sealImage(
    staging: string,
    key: string,
    kind: 'debian' | 'oci',
    source: string,
    digest: string,
    started: number,
    ctx: ImageBuildContext,
  ): Promise<void> {
    const { stdout } = await execTool('du', ['-sb', path.join(staging, 'rootfs')], { code: 'storage_error' })
    const sizeBytes = Number.parseInt(stdout, 10) || 0
    const maxBytes = this.maxBytes
    if (sizeBytes > maxBytes)
      throw new CairnProblem(
        'build_failed',
        `image ${key} is ${mebibytes(sizeBytes)} MiB, above the operator's maximum of ${mebibytes(maxBytes)} MiB (--max-image-mib)`,
      )
    const buildMs = Date.now() - started
    await this.options.store.seal(staging, {
      key,
      kind,
      source,
      digest,
      sizeBytes,
      builtAt: new Date().toISOString(),
      buildMs,
    })
    ctx.log(`image: ${key} ready (${mebibytes(sizeBytes)} MiB, ${buildMs} ms)`)
  }
}

/** `registry[:port]` of an OCI reference. */
export function registryOf(reference: string): string {
  return reference.slice(0, reference.indexOf('/'))
}

/** `registry[:port]/path` of an OCI reference, without its tag or digest. */
export function repositoryOf(reference: string): string {
  const at = reference.indexOf('@')
  const base = at >= 0 ? reference.slice(0, at) : reference
  const colon = base.lastIndexOf(':')
  return colon > base.lastIndexOf('/') ? base.slice(0, colon) : base
}
