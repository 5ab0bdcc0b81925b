import { readFileSync } from 'node:fs'
import { describe, expect, it } from 'vitest'
import { CLI_VERSION } from './context.js'

describe('CLI_VERSION', () => {
  it("is the package's version, which bin/cairn.js prints for a bare --version without loading the CLI", () => {
    const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as {
      version: string
    }
    expect(CLI_VERSION).toBe(pkg.version)
  })
})
