import { execFile } from 'node:child_process'
import { cp, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { promisify } from 'node:util'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { EXAMPLES, packDir, REPO_ROOT, startTestServer, type TestServer } from './helpers/server.js'

/**
 * The SDK outside this repo, as a user gets it: `npm pack` of @cairn/sdk alone, that one tarball
 * installed into an empty project (the npm registry's cache serves its two dependencies), a file
 * of the hosted docs' SDK calls type-checked with `tsc --strict` against what was installed, run
 * by Node against a real server, and bundled for the browser with esbuild.
 */

const run = promisify(execFile)
const BIN = path.join(REPO_ROOT, 'node_modules/.bin')

/** The hosted docs' calls, as written there (default export, idleTimeout in seconds, resume by prefix). */
const APP = `import Cairn from '@cairn/sdk'

export async function main(apiKey: string, baseUrl: string) {
  const client = new Cairn({ apiKey, baseUrl })
  const session = await client.createSession('my-agent', {
    title: 'Debug authentication module',
    idleTimeout: 3600,
  })
  const r1 = await session.run('What files handle auth?')
  let streamed = ''
  const stream = session.stream('Run the tests')
  for await (const chunk of stream.textStream) streamed += chunk
  await session.end()
  const resumed = await client.sessions.resolve(session.id.slice(0, 8))
  await resumed.resume()
  const r3 = await resumed.run('Fix any failures')
  await resumed.end()
  return { id: session.id, resumedId: resumed.id, first: r1.text, streamed, third: r3.text, status: resumed.info.status }
}
`

let t: TestServer
let scratch = ''
let app = ''

beforeAll(async () => {
  t = await startTestServer()
  expect(
    (await t.api.call('POST', '/v1/agents?name=my-agent', await packDir(`${EXAMPLES}/echo`))).status,
  ).toBe(201)
  scratch = await mkdtemp(path.join(os.tmpdir(), 'cairn-sdk-tarball-'))
  app = path.join(scratch, 'app')
  await mkdir(app)
}, 60_000)

afterAll(async () => {
  await t?.close()
  if (scratch) await rm(scratch, { recursive: true, force: true })
})

describe('the SDK from one tarball', () => {
  it('packs alone, installs into an empty project, type-checks strictly, runs the hosted docs’ calls and bundles for the browser', async () => {
    // Packed from a copy of the two packages as built (prepack rewrites the SDK's dist in place,
    // which test files running beside this one import).
    for (const [pkg, parts] of [
      ['sdk', ['package.json', 'scripts', 'dist']],
      ['protocol', ['package.json', 'dist']],
    ] as const)
      for (const part of parts)
        await cp(path.join(REPO_ROOT, 'packages', pkg, part), path.join(scratch, 'packages', pkg, part), {
          recursive: true,
        })
    await run('npm', ['pack', '--pack-destination', scratch, '--silent'], {
      cwd: path.join(scratch, 'packages/sdk'),
    })
    const tarballs = (await readdir(scratch)).filter((name) => name.endsWith('.tgz'))
    expect(tarballs).toEqual(['cairn-sdk-0.1.0.tgz'])
    await writeFile(
      path.join(app, 'package.json'),
      JSON.stringify({ name: 'app', private: true, type: 'module' }),
    )
    // The registry is only asked what the cache lacks: the tarball is the one package of ours.
    await run(
      'npm',
      ['install', '--prefer-offline', '--no-audit', '--no-fund', '--no-save', `../${tarballs[0]}`],
      { cwd: app },
    )
    const installed = (await readdir(path.join(app, 'node_modules'))).filter((n) => !n.startsWith('.'))
    expect(installed.sort()).toEqual(['@cairn', '@sinclair', 'eventsource-parser'])
    expect(await readdir(path.join(app, 'node_modules/@cairn'))).toEqual(['sdk'])

    await writeFile(path.join(app, 'app.ts'), APP)
    // Strict, with the SDK's own declarations checked too (no skipLibCheck), and no Node types.
    const compilerOptions = {
      strict: true,
      target: 'es2022',
      module: 'nodenext',
      moduleResolution: 'nodenext',
      lib: ['es2022', 'dom', 'dom.asynciterable'],
      types: [],
      outDir: 'out',
    }
    await writeFile(path.join(app, 'tsconfig.json'), JSON.stringify({ compilerOptions, files: ['app.ts'] }))
    await run(path.join(BIN, 'tsc'), ['-p', '.'], { cwd: app }).catch((error: { stdout?: string }) => {
      throw new Error(`tsc --strict failed:\n${error.stdout}`)
    })

    const runner = `import { main } from './out/app.js'\nconsole.log(JSON.stringify(await main(process.argv[2], process.argv[3])))\n`
    await writeFile(path.join(app, 'run.mjs'), runner)
    const { stdout } = await run(process.execPath, ['run.mjs', t.key, t.url], { cwd: app })
    const result = JSON.parse(stdout)
    expect(result).toMatchObject({
      resumedId: result.id,
      first: 'What files handle auth?\n',
      streamed: 'Run the tests\n',
      third: 'Fix any failures\n',
      status: 'completed',
    })
    const session = await t.api.call('GET', `/v1/sessions/${result.id}`)
    expect(session.body.policy.idleTimeoutMs).toBe(3_600_000)

    // The browser: one bundle, no Node built-in reached (esbuild fails on one for platform browser).
    await run(
      path.join(BIN, 'esbuild'),
      [
        'app.ts',
        '--bundle',
        '--platform=browser',
        '--format=esm',
        '--outfile=browser.js',
        '--log-level=error',
      ],
      { cwd: app },
    )
    const bundle = await readFile(path.join(app, 'browser.js'), 'utf8')
    expect(bundle).toContain('/v1/sessions/resolve')
    expect(bundle).not.toMatch(/from\s*["']node:|require\(["'](node:)?(fs|path|http|https|net|stream)["']\)/)
  }, 180_000)
})
