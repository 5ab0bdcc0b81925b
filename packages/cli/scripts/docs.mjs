// Regenerates the command reference in docs/cli.md from the built CLI (`npm run build` first).
import { execFileSync } from 'node:child_process'
import { readFile, writeFile } from 'node:fs/promises'
import { fileURLToPath } from 'node:url'
import { Context } from '../dist/context.js'
import { cliReference, withReference } from '../dist/docs.js'
import { Output } from '../dist/output.js'
import { buildProgram } from '../dist/program.js'

const file = fileURLToPath(new URL('../../../docs/cli.md', import.meta.url))
const ctx = new Context(
  { json: false, color: false, apiUrl: undefined, apiKey: undefined },
  {},
  new Output({ json: false, color: false }),
)
const current = await readFile(file, 'utf8').catch(() => '# cairn\n')
await writeFile(file, withReference(current, cliReference(await buildProgram(ctx))))
// The repository's formatter pads the tables; the docs test compares modulo that padding.
execFileSync('npx', ['biome', 'format', '--write', file], { stdio: 'ignore' })
console.log(`wrote ${file}`)
