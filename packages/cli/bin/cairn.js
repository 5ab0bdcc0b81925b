#!/usr/bin/env node
// The CLI bundled into one file (dist/cairn.cjs, `npm run build`) and run with V8's code cache;
// without a bundle as new as the compiled modules (a bare `tsc -b`), the modules themselves.
import { statSync } from 'node:fs'
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
const mtime = (file) => {
  try {
    return statSync(new URL(file, import.meta.url)).mtimeMs
  } catch {
    return undefined
  }
}
const bundled = mtime('../dist/cairn.cjs')
const compiled = mtime('../dist/main.js')
let cli
if (bundled !== undefined && compiled !== undefined && bundled >= compiled) {
  // One code cache for the CLI, whatever the directory it runs in (the default is named by the cwd).
  require('v8-compile-cache-lib').install({ prefix: 'cairn-cli' })
  cli = require('../dist/cairn.cjs')
} else {
  cli = await import('../dist/main.js')
}
await cli.run()
