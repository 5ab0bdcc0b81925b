import { lstatSync, readdirSync, readFileSync, readlinkSync, statSync, writeFileSync } from 'node:fs'
import { mkdir, mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { ERROR_CODES, isErrorCode } from '@cairn/protocol'
import { extractArchive } from '@cairn/runtime'
import { inspectArchive } from '@cairn/server'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { FUZZ_MARKER, fuzzSeed, listTree, markerEntries, Rng, SHARED_PLACES } from '../helpers/fuzz.js'
import { fuzzArchive } from '../helpers/fuzz-tar.js'
import { type RawEntry, rawTarGz } from '../helpers/raw-tar.js'
import { startTestServer, type TestServer } from '../helpers/server.js'

// Archive-reader fuzzing: generated tarballs go through the deploy checks (`inspectArchive`) and,
// when accepted, through the extraction a deploy does next. Each must end in a typed refusal or
// in files inside the target only; a sample goes through the real HTTP deploy route.

const SEED = fuzzSeed('fuzz-archive', 0x7a4_0006)
const ARCHIVES = Number(process.env.FUZZ_ARCHIVES ?? 10_000)
const HTTP_SAMPLE = Number(process.env.FUZZ_HTTP_SAMPLE ?? 200)
const LIMITS = { maxFiles: 50, maxUnpackedBytes: 256 * 1024 }
const STEP_TIMEOUT_MS = 5_000
const REFUSALS = new Set(['invalid_archive', 'payload_too_large'])

let sentinel = ''
let t: TestServer | undefined

beforeAll(async () => {
  sentinel = await mkdtemp(path.join(os.tmpdir(), 'cairn-fuzz-archive-'))
})

afterAll(async () => {
  await t?.close()
  if (sentinel) await rm(sentinel, { recursive: true, force: true })
})

/** Fails a step that does not settle: a reader that hangs on some input is a finding too. */
function within<T>(ms: number, what: string, work: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<never>((_resolve, reject) => {
    timer = setTimeout(() => reject(new Error(`HANG: ${what} did not settle within ${ms} ms`)), ms)
  })
  return Promise.race([work, timeout]).finally(() => clearTimeout(timer))
}

function typedRefusal(error: unknown): string | undefined {
  const code = (error as { code?: unknown })?.code
  const name = (error as { name?: unknown })?.name
  if (name === 'CairnProblem' && typeof code === 'string' && REFUSALS.has(code)) return undefined
  return `${name}: ${String((error as Error)?.message).slice(0, 200)} (code ${String(code)})`
}

/** What an extracted tree holds that it must not: links leading out, setuid/setgid files, devices. */
function strayIn(target: string): string[] {
  const problems: string[] = []
  const walk = (dir: string) => {
    for (const name of readdirSync(dir)) {
      const abs = path.join(dir, name)
      const info = lstatSync(abs)
      if (info.isSymbolicLink()) {
        const resolved = path.resolve(dir, readlinkSync(abs))
        if (resolved !== target && !resolved.startsWith(`${target}/`))
          problems.push(`symlink ${path.relative(target, abs)} -> ${readlinkSync(abs)} leads out`)
      } else if (info.isDirectory()) walk(abs)
      else if (!info.isFile()) problems.push(`${path.relative(target, abs)} is a special file`)
      if (!info.isSymbolicLink() && info.mode & 0o6000)
        problems.push(`${path.relative(target, abs)} has mode ${(info.mode & 0o7777).toString(8)}`)
    }
  }
  walk(target)
  return problems
}

describe('archive fuzzing', () => {
  it(`reads ${ARCHIVES} generated archives: typed refusals, or files inside the target only`, async () => {
    const markersBefore = new Set(markerEntries(SHARED_PLACES))
    const decoy = path.join(sentinel, 'decoy.txt')
    writeFileSync(decoy, 'decoy\n')
    const work = path.join(sentinel, 'work')
    await mkdir(work)
    const findings: string[] = []
    const outcomes = new Map<string, number>()
    const count = (what: string) => outcomes.set(what, (outcomes.get(what) ?? 0) + 1)
    const only = process.env.FUZZ_ONLY === undefined ? undefined : Number(process.env.FUZZ_ONLY)
    for (let index = only ?? 0; index < (only === undefined ? ARCHIVES : only + 1); index++) {
      const rng = new Rng((SEED + Math.imul(index, 0x9e3779b1)) >>> 0)
      const { data, recipe } = fuzzArchive(rng)
      const report = (what: string) =>
        findings.push(`FUZZ_SEED=${SEED} FUZZ_ONLY=${index} (${recipe}): ${what}`)
      try {
        await within(STEP_TIMEOUT_MS, 'inspectArchive', inspectArchive(data, LIMITS))
      } catch (error) {
        const untyped = typedRefusal(error)
        if (untyped) report(`inspect threw ${untyped}`)
        count(untyped ? 'untyped' : `refused: ${(error as { code: string }).code}`)
        continue
      }
      count('accepted')
      const target = path.join(work, 'target')
      await mkdir(target)
      try {
        await within(STEP_TIMEOUT_MS, 'extractArchive', extractArchive(data, target))
      } catch (error) {
        const untyped = typedRefusal(error)
        if (untyped) report(`extract threw ${untyped}`)
        count(untyped ? 'extract untyped' : 'extract refused')
      }
      for (const problem of strayIn(target)) report(problem)
      const beside = readdirSync(work)
      if (beside.length !== 1) report(`written beside the target: ${beside.join(', ')}`)
      await rm(work, { recursive: true, force: true }).catch((error: Error) =>
        report(`the target could not be removed after extraction (still being written?): ${error.message}`),
      )
      await rm(work, { recursive: true, force: true })
      await mkdir(work)
    }
    console.log(`[fuzz-archive] seed ${SEED}: ${JSON.stringify(Object.fromEntries(outcomes))}`)
    for (const finding of findings.slice(0, 30)) console.log(`[fuzz-archive] ${finding}`)
    expect(findings).toEqual([])
    expect(outcomes.get('accepted') ?? 0).toBeGreaterThan(ARCHIVES / 20)

    // Nothing outside: the sentinel holds what it held, the decoy was neither changed nor linked.
    expect(readdirSync(sentinel).sort()).toEqual(['decoy.txt', 'work'])
    expect(readFileSync(decoy, 'utf8')).toBe('decoy\n')
    expect(statSync(decoy).nlink).toBe(1)
    expect(markerEntries(SHARED_PLACES).filter((p) => !markersBefore.has(p))).toEqual([])
  }, 240_000)

  it(`answers ${HTTP_SAMPLE} generated archives on the deploy route with 201 or a typed 4xx, leaving no staging behind`, async () => {
    t = await startTestServer({
      server: {
        maxUploadBytes: 1024 * 1024,
        maxUnpackedBytes: LIMITS.maxUnpackedBytes,
        maxArchiveFiles: LIMITS.maxFiles,
        rateLimitPerSecond: 0,
      },
    })
    const markersBefore = new Set(markerEntries(SHARED_PLACES))
    const findings: string[] = []
    const statuses = new Map<number, number>()
    const rng = new Rng((SEED ^ 0x4877_7470) >>> 0)
    for (let index = 0; index < HTTP_SAMPLE; index++) {
      const { data, recipe } = fuzzArchive(rng)
      const res = await t.api.call('POST', '/v1/agents', data, { 'content-type': 'application/gzip' })
      statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1)
      const error = res.body?.error
      if (res.status === 201) continue
      if (
        res.status >= 500 ||
        !error ||
        !isErrorCode(error.code) ||
        ERROR_CODES[error.code].status !== res.status
      )
        findings.push(`sample ${index} (${recipe}): ${res.status} ${JSON.stringify(res.body).slice(0, 300)}`)
      else if (typeof error.requestId !== 'string')
        findings.push(`sample ${index}: error without a requestId`)
    }
    console.log(`[fuzz-archive] HTTP sample: ${JSON.stringify(Object.fromEntries(statuses))}`)
    expect(findings).toEqual([])
    expect((await fetch(`${t.url}/healthz`)).status).toBe(200)
    expect(readdirSync(path.join(t.server.runtime.pool.root, 'staging'))).toEqual([])
    expect(markerEntries(SHARED_PLACES).filter((p) => !markersBefore.has(p))).toEqual([])
    // Marker names exist in the pool only inside a revision's tree, never beside one.
    const beside = listTree(t.server.runtime.pool.root, 2).filter((p) => p.includes(FUZZ_MARKER))
    expect(beside).toEqual([])
    expect(listTree(t.dataDir, 6).filter((p) => p.includes(FUZZ_MARKER))).toEqual([])
  }, 240_000)
})

describe('archive cases fuzzing found (regressions)', () => {
  const manifest = { name: 'cairn.yaml', body: 'name: regress\ncommand: bash a.sh\n' }
  const refusedQuickly = async (entries: RawEntry[], message: string) => {
    const error = await within(
      STEP_TIMEOUT_MS,
      'inspectArchive',
      inspectArchive(rawTarGz([manifest, ...entries])),
    ).then(
      () => undefined,
      (e: unknown) => e,
    )
    expect(error).toMatchObject({ name: 'CairnProblem', code: 'invalid_archive' })
    expect((error as Error).message).toContain(message)
  }

  it('refuses entry orders node-tar would wait on forever, before anything is unpacked', async () => {
    await refusedQuickly(
      [
        { name: 'f', body: 'x' },
        { name: 'f/x', type: '1', linkname: 'f' },
      ],
      'not a directory',
    )
    await refusedQuickly(
      [
        { name: 'dir/sub/file', body: 'x' },
        { name: 'dir', type: '1', linkname: 'dir/sub/file' },
      ],
      'lies inside it',
    )
    await refusedQuickly(
      [
        { name: 'dir/sub/file', body: 'x' },
        { name: 'dir', body: 'a file where a directory with files is' },
      ],
      'replaces a directory',
    )
    await refusedQuickly(
      [
        { name: 'a/', type: '5' },
        { name: 'a/b', type: '2', linkname: 'a' },
      ],
      'contains it',
    )
    await refusedQuickly([{ name: 'd', type: '2', linkname: 'd/x' }], 'lies inside it')
  })

  it('gives up an extraction that makes no progress, with a typed error', async () => {
    const target = path.join(sentinel, 'stall')
    await mkdir(target)
    const hanging = rawTarGz([{ name: 'd', type: '2', linkname: 'd/x' }])
    const error = await extractArchive(hanging, target, { stallTimeoutMs: 300 }).catch((e: unknown) => e)
    expect(error).toMatchObject({ name: 'CairnProblem', code: 'invalid_archive' })
    expect((error as Error).message).toContain('no progress')
  })

  it('drops setuid, setgid and sticky bits and answers file-system refusals as invalid_archive', async () => {
    const target = path.join(sentinel, 'modes')
    await mkdir(target)
    const archive = rawTarGz([
      manifest,
      { name: 'suid', body: 'x', mode: 0o6755 },
      { name: 'dir/', type: '5', mode: 0o3777 },
    ])
    await inspectArchive(archive)
    await extractArchive(archive, target)
    expect(statSync(path.join(target, 'suid')).mode & 0o7000).toBe(0)
    expect(statSync(path.join(target, 'dir')).mode & 0o7000).toBe(0)
    // A hard link to nothing passes the checks but cannot be made: typed, not a 500.
    const dangling = rawTarGz([manifest, { name: 'h', type: '1', linkname: 'missing' }])
    await inspectArchive(dangling)
    const error = await extractArchive(dangling, path.join(sentinel, 'modes')).catch((e: unknown) => e)
    expect(error).toMatchObject({ name: 'CairnProblem', code: 'invalid_archive' })
    if (t) {
      const res = await t.api.call('POST', '/v1/agents', dangling)
      expect(res.status).toBe(400)
      expect(res.body.error.code).toBe('invalid_archive')
      expect(readdirSync(path.join(t.server.runtime.pool.root, 'staging'))).toEqual([])
    }
  })
})
