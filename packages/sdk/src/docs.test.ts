import { readFile } from 'node:fs/promises'
import { fileURLToPath } from 'node:url'
import { describe, expect, it } from 'vitest'
import * as sdk from './index.js'

describe('docs/sdk.md', () => {
  it('mentions every export of the SDK', async () => {
    const doc = await readFile(fileURLToPath(new URL('../../../docs/sdk.md', import.meta.url)), 'utf8')
    const missing = Object.keys(sdk).filter((name) => !new RegExp(`\\b${name}\\b`).test(doc))
    expect(missing).toEqual([])
  })
})
