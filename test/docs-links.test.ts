import { existsSync, readdirSync, readFileSync } from 'node:fs'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { REPO_ROOT } from './helpers/server.js'

// Every link from the README and docs/ to a file of the repository reaches it, and a `#section`
// in it reaches a heading of that file (GitHub's anchors: lower case, punctuation dropped, spaces
// as hyphens).

const FILES = [
  'README.md',
  ...readdirSync(path.join(REPO_ROOT, 'docs'), { recursive: true, encoding: 'utf8' })
    .filter((f) => f.endsWith('.md'))
    .map((f) => `docs/${f}`),
]

function anchors(markdown: string): Set<string> {
  const found = new Set<string>()
  const seen = new Map<string, number>()
  let fenced = false
  for (const line of markdown.split('\n')) {
    if (line.startsWith('```')) fenced = !fenced
    const heading = fenced ? null : /^#{1,6}\s+(.*)$/.exec(line)
    if (!heading?.[1]) continue
    const slug = heading[1]
      .trim()
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, '')
      .replace(/\s/g, '-')
    const n = seen.get(slug) ?? 0
    seen.set(slug, n + 1)
    found.add(n === 0 ? slug : `${slug}-${n}`)
  }
  return found
}

/** The relative links of a markdown file (not in code), as [target file, anchor]. */
function links(markdown: string): { target: string; anchor: string | undefined }[] {
  const out: { target: string; anchor: string | undefined }[] = []
  const prose = markdown.replace(/```[\s\S]*?```/g, '').replace(/`[^`\n]*`/g, '')
  for (const match of prose.matchAll(/\]\(([^)\s]+)\)/g)) {
    const href = match[1] as string
    if (/^[a-z]+:/i.test(href)) continue
    const [target, anchor] = href.split('#')
    out.push({ target: target ?? '', anchor })
  }
  return out
}

describe('docs links', () => {
  it.each(FILES)('%s: each relative link reaches its file and section', (file) => {
    const text = readFileSync(path.join(REPO_ROOT, file), 'utf8')
    const broken: string[] = []
    for (const { target, anchor } of links(text)) {
      const resolved =
        target === ''
          ? path.join(REPO_ROOT, file)
          : path.resolve(path.dirname(path.join(REPO_ROOT, file)), target)
      if (!existsSync(resolved)) {
        broken.push(`${target}: no such file`)
        continue
      }
      if (anchor === undefined || !resolved.endsWith('.md')) continue
      if (!anchors(readFileSync(resolved, 'utf8')).has(anchor))
        broken.push(`${target}#${anchor}: no such section`)
    }
    expect(broken).toEqual([])
  })
})
