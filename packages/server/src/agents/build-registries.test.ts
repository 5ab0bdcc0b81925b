import { describe, expect, it } from 'vitest'
import { pipIndexUrls, registryRule } from './build-registries.js'

describe('build registries', () => {
  it('turns registry URLs into allowlist entries, and leaves out what needs no network', () => {
    expect(registryRule('https://registry.npmjs.org/')).toBe('registry.npmjs.org')
    expect(registryRule('http://user:pass@mirror.internal:8081/simple')).toBe('mirror.internal:8081')
    expect(registryRule('file:///opt/pypi/simple')).toBeUndefined()
    expect(registryRule('not a url')).toBeUndefined()
  })

  it("reads pip's index URLs from `pip config list`, from files and the environment", () => {
    const listed = [
      "global.cert='/etc/ssl/certs/ca-certificates.crt'",
      "global.extra-index-url='file:///opt/pypi/simple https://extra.example/simple'",
      ":env:.index-url='https://mirror.example/simple'",
      "global.find-links='/opt/wheels'",
    ].join('\n')
    expect(pipIndexUrls(listed)).toEqual({
      index: ['https://mirror.example/simple'],
      extra: ['file:///opt/pypi/simple', 'https://extra.example/simple'],
    })
  })
})
