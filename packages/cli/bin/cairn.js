#!/usr/bin/env node
// Starts the CLI: the bundle (dist/cairn.cjs, `npm run build`) compiled with V8's code cache, or,
// when there is no bundle as new as the compiled modules (a bare `tsc -b`), the modules themselves.
// CommonJS (bin/package.json): Node's ESM loader alone costs a command several ms.
const fs = require('node:fs')
const Module = require('node:module')
const os = require('node:os')
const path = require('node:path')
const vm = require('node:vm')

const dist = path.join(__dirname, '..', 'dist')
const bundle = path.join(dist, 'cairn.cjs')

function stat(file) {
  try {
    return fs.statSync(file)
  } catch {
    return undefined
  }
}

/** The user's own cache directory (never a shared one: a code cache is code). */
function cacheDir() {
  const base = process.env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache')
  return path.join(base, 'cairn')
}

/**
 * Whether `info` (an lstat or fstat) is the user's own and writable by nobody else. V8 checks a code
 * cache only against its source's length, so a cache another user could write (a `~/.cache` under a
 * HOME every user can write, such as /tmp) would run their code as this user.
 */
function ownedPrivately(info) {
  const uid = process.getuid ? process.getuid() : undefined
  return uid === undefined || (info.uid === uid && (info.mode & 0o022) === 0)
}

/** The cache directory, made if missing, when it is a directory of the user's own only; else undefined. */
function privateCacheDir(dir) {
  try {
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 })
    const info = fs.lstatSync(dir)
    return info.isDirectory() && ownedPrivately(info) ? dir : undefined
  } catch {
    return undefined
  }
}

/** The cache file's bytes, when it is a file of the user's own that no one else can write. */
function readOwnCache(file) {
  let fd
  try {
    fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW)
    const info = fs.fstatSync(fd)
    return info.isFile() && ownedPrivately(info) ? fs.readFileSync(fd) : undefined
  } catch {
    return undefined
  } finally {
    if (fd !== undefined) fs.closeSync(fd)
  }
}

/**
 * Runs the bundle through `vm.Script` with the code cache V8 made on an earlier run, keyed by the
 * bundle's size and mtime; a missing or rejected cache is written at exit, once the command has run,
 * so it holds every function the command compiled (v8-compile-cache-lib makes it before the run, for
 * the top level only, and hashes the 1 MB source each time: 20 ms more per command here).
 */
function runBundle(info) {
  const name = `cli-${process.version}-${info.size}-${Math.floor(info.mtimeMs)}.v8cache`
  const dir = process.env.CAIRN_NO_CODE_CACHE ? undefined : privateCacheDir(cacheDir())
  const useCache = dir !== undefined
  const cachedData = useCache ? readOwnCache(path.join(dir, name)) : undefined
  const source = fs.readFileSync(bundle, 'utf8')
  const script = new vm.Script(Module.wrap(source), {
    filename: bundle,
    cachedData,
  })
  if (useCache && (cachedData === undefined || script.cachedDataRejected)) {
    process.once('exit', () => {
      try {
        for (const old of fs.readdirSync(dir))
          if (old.startsWith('cli-') && old !== name) fs.rmSync(path.join(dir, old))
        const tmp = path.join(dir, `.${name}.${process.pid}`)
        fs.writeFileSync(tmp, script.createCachedData(), { mode: 0o600 })
        fs.renameSync(tmp, path.join(dir, name))
      } catch {} // no cache this time: the next run compiles again
    })
  }
  const cli = new Module(bundle, module)
  cli.filename = bundle
  cli.paths = Module._nodeModulePaths(dist)
  script.runInThisContext()(cli.exports, Module.createRequire(bundle), cli, bundle, dist)
  cli.loaded = true
  return cli.exports
}

/**
 * A reader that goes away (`cairn … | head -1`) ends the command quietly: a write to a closed stdout
 * exits at once, status 0 (what was wanted was read), and a closed stderr is written no more. Without
 * this, Node reports the EPIPE as an uncaught error with its stack. Every command, once, here.
 */
function endQuietlyOnClosedPipes() {
  const closed = (error) => error.code === 'EPIPE' || error.code === 'ERR_STREAM_DESTROYED'
  process.stdout.on('error', (error) => {
    if (!closed(error)) throw error
    process.exit(0)
  })
  process.stderr.on('error', (error) => {
    if (!closed(error)) throw error
  })
}

function start() {
  endQuietlyOnClosedPipes()
  const args = process.argv.slice(2)
  // `cairn --version` alone needs nothing loaded (context.test.ts keeps CLI_VERSION equal to it).
  if (args.length === 1 && (args[0] === '--version' || args[0] === '-v')) {
    process.stdout.write(`${require('../package.json').version}\n`)
    return
  }
  const bundled = stat(bundle)
  const compiled = stat(path.join(dist, 'main.js'))
  // `cairn server`, `cairn node`, `cairn migrate`, `cairn cluster` and `cairn mcp` import
  // @cairn/server, and `cairn doctor` @cairn/runtime/doctor, which code compiled by vm.Script cannot do on Node 20
  // without an experimental flag; their start-up is their own, so they run from the modules (as
  // does any command line that merely names them, an agent say: correct, only slower).
  const fresh = bundled && compiled && bundled.mtimeMs >= compiled.mtimeMs
  const importsServer = ['server', 'node', 'migrate', 'cluster', 'doctor', 'mcp'].some((name) =>
    args.includes(name),
  )
  if (fresh && !importsServer) runBundle(bundled).run()
  else import(path.join(dist, 'main.js')).then((cli) => cli.run())
}

start()
