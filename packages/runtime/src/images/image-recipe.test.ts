import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { describe, expect, it, onTestFinished } from 'vitest'
import { hostDebianMirror } from './debian-mirror.js'
import { repositoryOf } from './image-builder.js'
import { debianImageKey, ociImageKey, parseImage } from './image-recipe.js'

const MIRROR = 'http://deb.example.org/debian'

describe('parseImage', () => {
  it('reads host, Debian recipes and OCI references', () => {
    expect(parseImage('host', undefined, MIRROR)).toEqual({ kind: 'host' })
    expect(parseImage('debian:bookworm', ['ripgrep', 'git', 'git'], MIRROR)).toEqual({
      kind: 'debian',
      suite: 'bookworm',
      packages: ['git', 'ripgrep'],
      mirror: MIRROR,
    })
    for (const reference of [
      'registry.example.com/team/agent-base:1.4',
      '10.0.0.5:5000/team/base',
      `ghcr.io/a/b@sha256:${'a'.repeat(64)}`,
    ])
      expect(parseImage(reference, undefined, MIRROR)).toEqual({ kind: 'oci', reference })
  })

  it('refuses what it cannot make, as invalid_manifest', () => {
    for (const [image, packages, message] of [
      ['python:3.12', undefined, /none of 'host'/],
      ['debian:Bookworm', undefined, /none of 'host'/],
      ['host', ['git'], /needs a Debian image/],
      ['registry.example.com/a:1', ['git'], /an OCI image brings its own/],
      ['debian:bookworm', ['--allow-unauthenticated'], /not a Debian package name/],
    ] as const) {
      expect(() => parseImage(image, packages, MIRROR)).toThrow(message)
      try {
        parseImage(image, packages, MIRROR)
      } catch (error) {
        expect((error as { code: string }).code).toBe('invalid_manifest')
      }
    }
  })
})

describe('image keys', () => {
  it('key a Debian recipe by everything its build reads, in any package order', () => {
    const key = debianImageKey({
      kind: 'debian',
      suite: 'bookworm',
      packages: ['git', 'ripgrep'],
      mirror: MIRROR,
    })
    expect(key).toMatch(/^debian-[0-9a-f]{32}$/)
    const same = parseImage('debian:bookworm', ['ripgrep', 'git'], MIRROR)
    expect(same.kind === 'debian' && debianImageKey(same)).toBe(key)
    for (const other of [
      parseImage('debian:trixie', ['git', 'ripgrep'], MIRROR),
      parseImage('debian:bookworm', ['git'], MIRROR),
      parseImage('debian:bookworm', ['git', 'ripgrep'], 'http://other.example.org/debian'),
    ])
      expect(other.kind === 'debian' && debianImageKey(other)).not.toBe(key)
  })

  it('key an OCI image by its digest, refusing anything else', () => {
    expect(ociImageKey(`sha256:${'b'.repeat(64)}`)).toBe(`oci-${'b'.repeat(64)}`)
    expect(() => ociImageKey('sha256:../../etc')).toThrow(/unexpected digest/)
  })

  it('drops the tag or digest of a reference', () => {
    expect(repositoryOf('10.0.0.5:5000/team/base:1.4')).toBe('10.0.0.5:5000/team/base')
    expect(repositoryOf('10.0.0.5:5000/team/base')).toBe('10.0.0.5:5000/team/base')
    expect(repositoryOf(`r.example/a@sha256:${'c'.repeat(64)}`)).toBe('r.example/a')
  })
})

describe('hostDebianMirror', () => {
  it('finds the first non-security source in sources.list or deb822 files', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-apt-'))
    onTestFinished(() => rm(dir, { recursive: true, force: true }))
    await mkdir(path.join(dir, 'sources.list.d'))
    expect(hostDebianMirror(dir)).toBeUndefined()
    await writeFile(
      path.join(dir, 'sources.list.d', 'debian.sources'),
      'Types: deb\nURIs: http://security.debian.org/debian-security\nSuites: bookworm-security\n\nTypes: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm\n',
    )
    expect(hostDebianMirror(dir)).toBe('http://mirror.example/debian')
    await writeFile(
      path.join(dir, 'sources.list'),
      '# comment\ndeb [arch=amd64] http://old.example/debian bookworm main\n',
    )
    expect(hostDebianMirror(dir)).toBe('http://old.example/debian')
  })
})
