// Bundles the built CLI (dist/main.js, from `tsc -b`) into one CommonJS file, dist/cairn.cjs, that
// bin/cairn.js loads with V8's code cache: one file to read and no module graph to resolve, so a
// command starts at once (bench/cli.ts). `cairn server` still imports @cairn/server on demand.
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import * as esbuild from 'esbuild'

const here = path.dirname(fileURLToPath(import.meta.url))

/**
 * commander requires node:child_process when it loads, for subcommands run as executables, which
 * this CLI has none of: loading it (with dgram and the rest it pulls in) cost every command ~2 ms
 * of CPU. commander gets a stand-in that requires the module at its first use.
 */
const lazyChildProcessForCommander = {
  name: 'lazy-child-process-for-commander',
  setup(build) {
    build.onResolve({ filter: /^(node:)?child_process$/ }, (args) =>
      args.importer.includes(`${path.sep}commander${path.sep}`)
        ? { path: 'lazy-child-process', namespace: 'lazy' }
        : undefined,
    )
    build.onLoad({ filter: /.*/, namespace: 'lazy' }, () => ({
      contents: "module.exports = new Proxy({}, { get: (_, name) => require('node:child_process')[name] })",
      loader: 'js',
    }))
  },
}

await esbuild.build({
  entryPoints: [path.join(here, 'dist/main.js')],
  outfile: path.join(here, 'dist/cairn.cjs'),
  bundle: true,
  format: 'cjs',
  platform: 'node',
  target: 'node20',
  // The server (native modules, its own files) is loaded only by `cairn server`, from its package,
  // and the host checks only by `cairn doctor`.
  // yaml, tar and ignore (a third of the bundle) serve `deploy` and `init` only: required from
  // node_modules when those run, they are not read, nor their code cache deserialised, by every
  // other command.
  // ws serves `sessions shell` only, required from node_modules likewise.
  external: ['@cairn/server', '@cairn/runtime/doctor', 'yaml', 'tar', 'ignore', 'ws'],
  plugins: [lazyChildProcessForCommander],
  legalComments: 'none',
  // Half the bytes to read and V8 code cache to deserialise at each start.
  minify: true,
  logLevel: 'warning',
})
