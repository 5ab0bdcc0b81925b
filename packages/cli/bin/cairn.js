#!/usr/bin/env node
// The CLI bundled into one file (dist/cairn.cjs, `npm run build`) and run with V8's code cache;
// without a bundle as new as the compiled modules (a bare `tsc -b`), the modules themselves.
// CommonJS (bin/package.json): Node's ESM loader alone costs a command several ms.
const { statSync } = require('node:fs')
const path = require('node:path')

const dist = path.join(__dirname, '..', 'dist')
const mtime = (file) => {
  try {
    return statSync(path.join(dist, file)).mtimeMs
  } catch {
    return undefined
  }
}

function start() {
  const args = process.argv.slice(2)
  // `cairn --version` alone needs nothing loaded (context.test.ts keeps CLI_VERSION equal to it).
  if (args.length === 1 && (args[0] === '--version' || args[0] === '-v')) {
    process.stdout.write(`${require('../package.json').version}\n`)
    return
  }
  const bundled = mtime('cairn.cjs')
  const compiled = mtime('main.js')
  if (bundled !== undefined && compiled !== undefined && bundled >= compiled) {
    // One code cache for the CLI, whatever the directory it runs in (the default is named by the cwd).
    require('v8-compile-cache-lib').install({ prefix: 'cairn-cli' })
    require(path.join(dist, 'cairn.cjs')).run()
  } else {
    import(path.join(dist, 'main.js')).then((cli) => cli.run())
  }
}

start()
