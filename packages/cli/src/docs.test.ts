import { readFile } from 'node:fs/promises'
import { fileURLToPath } from 'node:url'
import { describe, expect, it } from 'vitest'
import { Context } from './context.js'
import { cliReference, generatedPart, normalizeMarkdown } from './docs.js'
import { Output } from './output.js'
import { buildProgram } from './program.js'

const DOC = fileURLToPath(new URL('../../../docs/cli.md', import.meta.url))

describe('docs/cli.md', () => {
  it('holds the reference generated from the real command tree', async () => {
    const ctx = new Context(
      { json: false, color: false, apiUrl: undefined, apiKey: undefined },
      {},
      new Output({ json: false, color: false }),
    )
    const reference = cliReference(await buildProgram(ctx))
    for (const name of [
      'cairn run',
      'cairn sessions resume',
      'cairn sessions events',
      'cairn sessions lease',
      'cairn sessions files put',
      'cairn sessions files get',
      'cairn secrets set',
      'cairn keys create',
      'cairn keys list',
      'cairn keys revoke',
      'cairn completion',
    ]) {
      expect(reference).toContain(`### \`${name}\``)
    }
    const markdown = await readFile(DOC, 'utf8')
    // On failure: `npm run build && node packages/cli/scripts/docs.mjs`
    expect(normalizeMarkdown(generatedPart(markdown) ?? '')).toBe(normalizeMarkdown(reference.trim()))
  })
})
