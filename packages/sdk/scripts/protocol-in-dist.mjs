// The SDK's package carries the wire contract it is built on: `npm pack` (prepack) copies
// @cairn/protocol's built files into dist/_protocol and points the SDK's imports of
// `@cairn/protocol` and `@cairn/protocol/core` at them, so one tarball installs anywhere (the
// protocol is not published on its own). `--undo` (postpack) puts the workspace's dist back as
// the build left it. The protocol's own dependencies must be the SDK's too: checked here.
import { cpSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const sdk = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const dist = path.join(sdk, 'dist')
const vendored = path.join(dist, '_protocol')
const protocol = path.resolve(sdk, '../protocol')
/** What each specifier becomes: its file inside dist/_protocol. */
const ENTRIES = { '@cairn/protocol': 'index.js', '@cairn/protocol/core': 'core.js' }

function outputs(dir) {
  return readdirSync(dir).flatMap((name) => {
    const full = path.join(dir, name)
    if (full === vendored) return []
    if (statSync(full).isDirectory()) return outputs(full)
    return /\.(js|d\.ts)$/.test(name) ? [full] : []
  })
}

function relativeTo(file, entry) {
  const rel = path.relative(path.dirname(file), path.join(vendored, entry)).split(path.sep).join('/')
  return rel.startsWith('.') ? rel : `./${rel}`
}

function checkDependencies() {
  const own = JSON.parse(readFileSync(path.join(sdk, 'package.json'), 'utf8')).dependencies ?? {}
  const needed = JSON.parse(readFileSync(path.join(protocol, 'package.json'), 'utf8')).dependencies ?? {}
  for (const [name, range] of Object.entries(needed))
    if (own[name] !== range)
      throw new Error(
        `@cairn/sdk must depend on ${name}@${range} as @cairn/protocol does (it has ${own[name]})`,
      )
}

function bundle() {
  checkDependencies()
  rmSync(vendored, { recursive: true, force: true })
  cpSync(path.join(protocol, 'dist'), vendored, {
    recursive: true,
    filter: (from) => statSync(from).isDirectory() || /\.(js|d\.ts)$/.test(from),
  })
  for (const file of outputs(dist)) {
    const text = readFileSync(file, 'utf8')
    const rewritten = text.replace(/(['"])(@cairn\/protocol(?:\/core)?)\1/g, (whole, quote, specifier) =>
      specifier in ENTRIES ? `${quote}${relativeTo(file, ENTRIES[specifier])}${quote}` : whole,
    )
    if (rewritten !== text) writeFileSync(file, rewritten)
  }
}

function undo() {
  for (const file of outputs(dist)) {
    const text = readFileSync(file, 'utf8')
    let restored = text
    for (const [specifier, entry] of Object.entries(ENTRIES))
      for (const quote of ["'", '"'])
        restored = restored
          .split(`${quote}${relativeTo(file, entry)}${quote}`)
          .join(`${quote}${specifier}${quote}`)
    if (restored !== text) writeFileSync(file, restored)
  }
  rmSync(vendored, { recursive: true, force: true })
}

if (process.argv.includes('--undo')) undo()
else bundle()
