// Bundles the console once into static files: dist/index.html and dist/assets/*-HASH.{js,css}.
// `@cairn/sdk` and `@cairn/protocol` are bundled from source, so this needs no earlier tsc run.
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import * as esbuild from 'esbuild'

const here = path.dirname(fileURLToPath(import.meta.url))
const packages = path.resolve(here, '..')

/** Builds the console into `outdir` (default: dist/) and returns the files written. */
export async function buildConsole({ outdir = path.join(here, 'dist'), minify = true } = {}) {
  await rm(outdir, { recursive: true, force: true })
  await mkdir(path.join(outdir, 'assets'), { recursive: true })
  const result = await esbuild.build({
    entryPoints: [path.join(here, 'src/main.ts')],
    bundle: true,
    format: 'esm',
    platform: 'browser',
    target: ['es2022', 'chrome110', 'firefox110', 'safari16'],
    minify,
    legalComments: 'none',
    outdir: path.join(outdir, 'assets'),
    entryNames: '[name]-[hash]',
    metafile: true,
    logLevel: 'warning',
    alias: {
      '@cairn/sdk': path.join(packages, 'sdk/src/index.ts'),
      '@cairn/protocol/core': path.join(packages, 'protocol/src/core.ts'),
      '@cairn/protocol': path.join(packages, 'protocol/src/index.ts'),
    },
  })
  const outputs = Object.keys(result.metafile.outputs).map((file) => path.basename(file))
  const js = outputs.find((f) => f.endsWith('.js'))
  const css = outputs.find((f) => f.endsWith('.css'))
  if (!js || !css) throw new Error(`console build produced ${outputs.join(', ')}`)
  const template = await readFile(path.join(here, 'src/index.html'), 'utf8')
  const html = template.replace('%CSS%', `/assets/${css}`).replace('%JS%', `/assets/${js}`)
  await writeFile(path.join(outdir, 'index.html'), html)
  return ['index.html', ...outputs.map((f) => `assets/${f}`)]
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const started = Date.now()
  const files = await buildConsole()
  console.log(`console: built ${files.join(', ')} in ${Date.now() - started} ms`)
}
