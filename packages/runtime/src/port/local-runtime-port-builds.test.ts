import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import type { Readable } from 'node:stream'
import { CairnProblem, newId } from '@cairn/protocol'
import * as tar from 'tar'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { openTestRuntime, sessionId, type TestRuntime } from '../../test/harness.js'
import type { TurnOutcome } from '../agent/types.js'
import { parseImage } from '../images/image-recipe.js'
import { LocalRuntimePort } from './local-runtime-port.js'
import type { RevisionBuild } from './runtime-port.js'

let t: TestRuntime
let port: LocalRuntimePort

/** A project as a deploy receives it: a tar.gz of its files. */
async function archiveOf(files: Record<string, string>): Promise<Buffer> {
  const dir = await mkdtemp(path.join(tmpdir(), 'cairn-port2-archive-'))
  try {
    for (const [name, body] of Object.entries(files)) {
      await mkdir(path.dirname(path.join(dir, name)), { recursive: true })
      await writeFile(path.join(dir, name), body)
    }
    const chunks: Buffer[] = []
    for await (const chunk of tar.c(
      { gzip: true, cwd: dir },
      Object.keys(files),
    ) as unknown as AsyncIterable<Buffer>)
      chunks.push(chunk)
    return Buffer.concat(chunks)
  } finally {
    await rm(dir, { recursive: true, force: true })
  }
}

async function readAll(stream: Readable): Promise<string> {
  const chunks: Buffer[] = []
  for await (const chunk of stream) chunks.push(chunk as Buffer)
  return Buffer.concat(chunks).toString('utf8')
}

function build(revisionId: string, fields: Partial<RevisionBuild>): RevisionBuild {
  return { revisionId, tenantId: 'ten_b', env: {}, egressAllow: [], timeoutMs: 30_000, ...fields }
}

async function refusal(promise: Promise<unknown>): Promise<string | undefined> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  )
  return error instanceof CairnProblem ? error.code : `not a CairnProblem: ${String(error)}`
}

const MEMORY_AGENT =
  'import sys\nwhile True:\n    line = input()\n    print(open("/memory/MEMORY.md").read().strip(), open("/memory/VERSION").read().strip())\n'

beforeAll(async () => {
  t = await openTestRuntime()
  port = new LocalRuntimePort(t.runtime, { clock: { now: () => Date.now() } })
})

afterAll(async () => {
  await port?.stopAllAgents()
  await t?.close()
})

describe('LocalRuntimePort: revisions, images and memory by ID', () => {
  it('stages a project archive, builds it (dependencies then setup, lines to onLog), seals it as a revision', async () => {
    const revisionId = newId('revision')
    await port.stageRevision(
      revisionId,
      'ten_b',
      await archiveOf({ 'cairn.yaml': 'name: b\n', 'src/a.txt': 'A\n' }),
    )
    // The staged tree is read by ID, as the deploy reads cairn.yaml and the lockfiles.
    const staged = { stagedRevisionId: revisionId }
    expect(await port.hasTree(staged)).toBe(true)
    expect(await port.hasPath(staged, 'src/a.txt')).toBe(true)
    expect(await readAll((await port.openFile(staged, Buffer.from('cairn.yaml'))).stream)).toBe('name: b\n')
    expect(await port.digest(staged)).toMatch(/^sha256:[0-9a-f]{64}$/)

    const lines: string[] = []
    const envKey = `node-${'a1'.repeat(16)}`
    const first = await port.buildRevision(
      build(revisionId, {
        dependencies: {
          envKey,
          files: ['cairn.yaml'],
          readsProject: false,
          command: [
            'sh',
            '-c',
            'echo installing; mkdir -p node_modules/dep && echo dep > node_modules/dep/x',
          ],
        },
        setup: ['sh', '-c', 'echo "setup sees $SETUP_TOKEN" && ls /env/node_modules/dep > built.txt'],
        env: { SETUP_TOKEN: 'tok' },
      }),
      (line) => lines.push(line),
    )
    expect(first.reusedEnv).toBe(false)
    expect(lines).toContain('installing')
    expect(lines).toContain('setup sees tok')
    await port.sealRevision(revisionId, 'ten_b')
    expect(await port.hasTree(staged)).toBe(false)
    expect(await readAll((await port.openFile({ revisionId }, Buffer.from('built.txt'))).stream)).toBe('x\n')

    // A second revision with the same environment key reuses it, installing nothing.
    const second = newId('revision')
    await port.stageRevision(second, 'ten_b', await archiveOf({ 'cairn.yaml': 'name: b\n' }))
    const again: string[] = []
    const result = await port.buildRevision(
      build(second, {
        dependencies: { envKey, files: ['cairn.yaml'], readsProject: false, command: ['false'] },
      }),
      (line) => again.push(line),
    )
    expect(result.reusedEnv).toBe(true)
    expect(again.join('\n')).toContain(`reusing environment ${envKey}`)
    await port.discardStagedRevision(second)
  })

  it('fails a build step with build_failed, discards the staged tree, and refuses an unknown or doubled revision', async () => {
    const revisionId = newId('revision')
    await port.stageRevision(revisionId, 'ten_b', await archiveOf({ 'cairn.yaml': 'name: c\n' }))
    expect(await refusal(port.stageRevision(revisionId, 'ten_b', await archiveOf({ x: 'y' })))).toBe(
      'conflict',
    )
    const lines: string[] = []
    expect(
      await refusal(
        port.buildRevision(build(revisionId, { setup: ['sh', '-c', 'echo broken >&2; exit 3'] }), (l) =>
          lines.push(l),
        ),
      ),
    ).toBe('build_failed')
    expect(lines).toContain('broken')
    await port.discardStagedRevision(revisionId)
    expect(await port.hasTree({ stagedRevisionId: revisionId })).toBe(false)
    expect(await port.listStored('staging')).not.toContain(revisionId)
    // Nothing staged under that ID any more: sealing or building it is refused, not guessed.
    expect(await refusal(port.sealRevision(revisionId, 'ten_b'))).toBe('not_found')
    expect(await refusal(port.buildRevision(build(revisionId, {}), () => undefined))).toBe('not_found')
    // An archive the file system refuses leaves no staging tree behind.
    const bad = newId('revision')
    expect(await refusal(port.stageRevision(bad, 'ten_b', Buffer.from('not a tar.gz')))).toBe(
      'invalid_archive',
    )
    expect(await port.hasTree({ stagedRevisionId: bad })).toBe(false)
    expect(await port.listStored('staging')).not.toContain(bad)
  })

  it('names images by key: none built in a new pool, keys of recipes, invalid keys refused', async () => {
    expect(await port.listImages()).toEqual([])
    const mirror = 'http://deb.debian.org/debian'
    expect(
      await port.imageKeyOf(parseImage('host', undefined, mirror), { log: () => undefined, timeoutMs: 1000 }),
    ).toBe(undefined)
    const recipe = parseImage('debian:bookworm', ['git'], mirror)
    const key = await port.imageKeyOf(recipe, { log: () => undefined, timeoutMs: 1000 })
    expect(key).toMatch(/^debian-[0-9a-f]{32,64}$/)
    expect(await port.hasImage(key as string)).toBe(false)
    expect(await port.image(key as string)).toBeUndefined()
    expect(await refusal(port.removeImage('../../etc'))).toBe('bad_request')
  })

  it("mounts the agent's published memory read-only at /memory, by agent ID", async () => {
    const revisionId = newId('revision')
    await port.stageRevision(revisionId, 'ten_b', await archiveOf({ 'agent.py': MEMORY_AGENT }))
    await port.sealRevision(revisionId, 'ten_b')
    const agentId = newId('agent')
    await port.publishMemory(agentId, 3, 'remember the milk\n')
    const id = sessionId('m')
    await port.createWorkspace(id, revisionId, 'ten_b')
    await port.startAgent({
      sessionId: id,
      tenantId: 'ten_b',
      command: ['python3', 'agent.py'],
      protocol: 'stdio',
      env: {},
      limits: { memoryMiB: 256, pids: 64, cpus: 1 },
      turnTimeoutMs: 10_000,
      memoryAgentId: agentId,
    })
    let outcome: TurnOutcome | undefined
    for await (const message of port.runTurn(id, {
      prompt: 'what?',
      turn: 1,
      turnId: newId('turn'),
      transcript: [],
    }))
      if (message.type === 'outcome') outcome = message.outcome
    expect(outcome).toMatchObject({ status: 'completed', text: 'remember the milk 3\n' })
    await port.stopAgent(id)
    // A path where an agent ID belongs is refused before anything is written.
    expect(await refusal(port.publishMemory('../escape', 1, 'x'))).toBe('bad_request')
    expect(
      await refusal(
        port.startAgent({
          sessionId: id,
          tenantId: 'ten_b',
          command: ['true'],
          protocol: 'stdio',
          env: {},
          limits: { memoryMiB: 256, pids: 64, cpus: 1 },
          turnTimeoutMs: 10_000,
          memoryAgentId: '../../',
        }),
      ),
    ).toBe('bad_request')
  })
})
