import { execFileSync } from 'node:child_process'
import { chmodSync, chownSync, existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import Module from 'node:module'
import os from 'node:os'
import path from 'node:path'
import vm from 'node:vm'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { assertBuilt, CLI_BIN } from '../helpers/cli.js'
import { REPO_ROOT } from '../helpers/server.js'

/**
 * The CLI's bin runs V8's code cache from the user's cache directory, and V8 checks a cache only
 * against its source's length: a cache made from any other script of that length runs instead of
 * the CLI. Here the user's HOME is a directory every local user can write (`/tmp`, as for a service
 * or a CI job), and another user (nobody) made `~/.cache/cairn` first and left a cache in it.
 */
const NOBODY = 65534
const BUNDLE = path.join(REPO_ROOT, 'packages/cli/dist/cairn.cjs')
let home = ''

beforeAll(async () => {
  assertBuilt()
  home = await mkdtemp(path.join(os.tmpdir(), 'cairn-review-cache-'))
  chmodSync(home, 0o1777)
})

afterAll(async () => {
  if (home) await rm(home, { recursive: true, force: true })
})

describe("the CLI's code cache", () => {
  it('never runs a cache another user planted in the cache directory', () => {
    const marker = path.join(home, 'planted-code-ran')
    const info = statSync(BUNDLE)
    const length = readFileSync(BUNDLE, 'utf8').length
    const evil = `require('node:fs').writeFileSync(${JSON.stringify(marker)}, String(process.getuid())); module.exports.run = Function.prototype`
    const planted = new vm.Script(Module.wrap(evil.padEnd(length, ' ')), { filename: BUNDLE })
    const dir = path.join(home, '.cache', 'cairn')
    mkdirSync(dir, { recursive: true, mode: 0o777 })
    const file = path.join(dir, `cli-${process.version}-${info.size}-${Math.floor(info.mtimeMs)}.v8cache`)
    writeFileSync(file, planted.createCachedData())
    for (const owned of [path.join(home, '.cache'), dir, file]) {
      chownSync(owned, NOBODY, NOBODY)
      chmodSync(owned, owned === file ? 0o666 : 0o777)
    }
    const env: NodeJS.ProcessEnv = { ...process.env, HOME: home }
    delete env.XDG_CACHE_HOME
    delete env.CAIRN_NO_CODE_CACHE
    const out = execFileSync(process.execPath, [CLI_BIN, '--help'], { env, encoding: 'utf8' })
    expect(existsSync(marker)).toBe(false)
    expect(out).toMatch(/cairn/i)
    // The planted cache is left alone, and nothing of ours was written into that directory.
    expect(statSync(file).uid).toBe(NOBODY)
  })
})
