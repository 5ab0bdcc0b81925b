import { createHash } from 'node:crypto'
import { CairnProblem } from '@cairn/protocol'

/**
 * What a sandbox's root is made of: the host's /usr (read-only, as before images), a Debian base
 * built with mmdebstrap from the operator's mirror, or an OCI image pulled from a registry.
 */
export type ImageRecipe =
  | { kind: 'host' }
  | { kind: 'debian'; suite: string; packages: readonly string[]; mirror: string }
  | { kind: 'oci'; reference: string }

/** `image: host`: the host's /usr and a few /etc files, read-only (the operator's explicit choice). */
export const HOST_IMAGE = 'host'

const DEBIAN = /^debian:([a-z]+)$/
/** `registry[:port]/path[:tag]` or `…@sha256:<hex>`: a registry host is required (no implied Docker Hub). */
const OCI_REFERENCE =
  /^(?:[a-z0-9.-]+|\[[0-9a-f:]+\])(?::[0-9]{1,5})?\/[a-z0-9._/-]+(?::[A-Za-z0-9_.-]{1,128}|@sha256:[0-9a-f]{64})?$/
const PACKAGE = /^[a-z0-9][a-z0-9+.-]*$/

// v1: mmdebstrap --variant=minbase, files handed to the sandbox uid, generated /etc written in.
const RECIPE_FORMAT = 'image-v1'

/**
 * The recipe of `image:` + `packages:` from cairn.yaml (or the operator's default image). Bad input
 * is an `invalid_manifest` problem naming what is accepted.
 */
export function parseImage(
  image: string,
  packages: readonly string[] | undefined,
  mirror: string,
): ImageRecipe {
  if (image === HOST_IMAGE) {
    if (packages && packages.length > 0)
      throw new CairnProblem(
        'invalid_manifest',
        "'packages' needs a Debian image (image: debian:<suite>), not 'host'",
      )
    return { kind: 'host' }
  }
  const debian = DEBIAN.exec(image)
  if (debian?.[1]) {
    for (const name of packages ?? [])
      if (!PACKAGE.test(name))
        throw new CairnProblem('invalid_manifest', `'${name}' is not a Debian package name`)
    return { kind: 'debian', suite: debian[1], packages: [...new Set(packages ?? [])].sort(), mirror }
  }
  if (OCI_REFERENCE.test(image)) {
    if (packages && packages.length > 0)
      throw new CairnProblem(
        'invalid_manifest',
        "'packages' is for Debian images (image: debian:<suite>); an OCI image brings its own",
      )
    return { kind: 'oci', reference: image }
  }
  throw new CairnProblem(
    'invalid_manifest',
    `image '${image}' is none of 'host', 'debian:<suite>' or an OCI reference 'registry.example.com/team/name:tag'`,
  )
}

/**
 * A Debian image's key: the hash of everything its build reads (suite, packages, mirror, the build's
 * format). Every revision with the same recipe shares the image, across tenants: the build runs no
 * code of theirs, only Debian's packages from the operator's mirror.
 */
export function debianImageKey(recipe: Extract<ImageRecipe, { kind: 'debian' }>): string {
  const hash = createHash('sha256').update(
    `${RECIPE_FORMAT}\0${recipe.suite}\0${recipe.mirror}\0${recipe.packages.join(' ')}\0`,
  )
  return `debian-${hash.digest('hex').slice(0, 32)}`
}

/** An OCI image's key: its manifest digest (`sha256:<hex>`). */
export function ociImageKey(digest: string): string {
  const hex = /^sha256:([0-9a-f]{64})$/.exec(digest)?.[1]
  if (!hex) throw new CairnProblem('build_failed', `registry answered an unexpected digest '${digest}'`)
  return `oci-${hex}`
}

/** How the recipe reads in listings and build logs. */
export function describeRecipe(recipe: ImageRecipe): string {
  switch (recipe.kind) {
    case 'host':
      return 'host /usr, read-only'
    case 'debian':
      return `debian:${recipe.suite}${recipe.packages.length ? ` + ${recipe.packages.join(', ')}` : ''} from ${recipe.mirror}`
    case 'oci':
      return recipe.reference
  }
}
