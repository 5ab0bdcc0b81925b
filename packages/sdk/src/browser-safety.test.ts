import { readdirSync, readFileSync } from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { describe, expect, it } from 'vitest'

const src = path.dirname(fileURLToPath(import.meta.url))
const NODE_BUILTIN =
  /(?:from\s+|import\s*\(\s*|require\s*\(\s*)['"](node:[^'"]+|fs|path|os|http|https|net|child_process|stream|crypto|url|util|events|buffer)['"]/g

function coreFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const full = path.join(dir, entry.name)
    if (entry.isDirectory()) return entry.name === 'node' ? [] : coreFiles(full)
    return entry.name.endsWith('.ts') && !entry.name.endsWith('.test.ts') ? [full] : []
  })
}

describe('SDK core', () => {
  it('imports no Node built-in outside src/node', () => {
    const offenders = coreFiles(src).flatMap((file) =>
      [...readFileSync(file, 'utf8').matchAll(NODE_BUILTIN)].map(
        (m) => `${path.relative(src, file)}: ${m[1]}`,
      ),
    )
    expect(offenders).toEqual([])
  })

  it('uses no Node-only globals', () => {
    const offenders = coreFiles(src).filter((file) =>
      /\b(Buffer|__dirname|require)\b/.test(readFileSync(file, 'utf8')),
    )
    expect(offenders).toEqual([])
  })
})
