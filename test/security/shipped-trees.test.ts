import { execFileSync } from 'node:child_process'
import { chmod, mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { Readable } from 'node:stream'
import { CairnProblem } from '@cairn/protocol'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { LocalRuntimePort } from '../../packages/runtime/src/port/local-runtime-port.js'
import { openTestRuntime, SANDBOX_UID, type TestRuntime } from '../../packages/runtime/test/harness.js'

// A revision reaches a node as a tar another node exported (`exportPoolTree` → `importPoolTree`),
// unpacked as root keeping owners and modes. The exporting node is another machine: if it is
// compromised, its tar must not put into this node's pool what no sandbox can make there — a
// device node (the host's disk, /dev/mem) or a set-uid root program — for whatever mounts the
// tree later to find.

let target: TestRuntime
let port: LocalRuntimePort
let work: string

beforeAll(async () => {
  target = await openTestRuntime()
  port = new LocalRuntimePort(target.runtime, { clock: { now: () => Date.now() } })
  work = await mkdtemp(path.join(tmpdir(), 'cairn-review-trees-'))
}, 120_000)

afterAll(async () => {
  await target?.close()
  if (work) await rm(work, { recursive: true, force: true })
})

let count = 0

/** A tree as a node would export it (tar, numeric owners), with `plant` run in it first. */
async function exported(plant: (dir: string) => Promise<void>): Promise<Readable> {
  const dir = path.join(work, `tree${++count}`)
  await mkdir(dir)
  await writeFile(path.join(dir, 'agent.py'), 'print("hi")\n')
  execFileSync('chown', ['-R', `${SANDBOX_UID}:${SANDBOX_UID}`, dir])
  await plant(dir)
  return Readable.from([
    execFileSync('tar', ['-c', '--numeric-owner', '--xattrs', '-C', dir, '.'], { maxBuffer: 1 << 26 }),
  ])
}

async function refusal(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    () => 'imported',
    (error: unknown) => error,
  )
}

async function stagingLeft(): Promise<string[]> {
  return readdir(target.runtime.pool.areaDir('staging'))
}

describe('a revision shipped from another node is untrusted', () => {
  it('refuses a tree holding a device node, and keeps nothing of it', async () => {
    for (const [name, major, minor] of [
      ['disk', 'b', '8'],
      ['mem', 'c', '1'],
    ] as const) {
      const revisionId = `rev_reviewdev${name}`
      const stream = await exported(async (dir) => {
        execFileSync('mknod', ['-m', '0666', path.join(dir, name), major, minor, '0'])
      })
      const error = await refusal(port.importPoolTree({ revisionId }, 'ten_review', stream))
      expect(error).toBeInstanceOf(CairnProblem)
      expect(error).toMatchObject({ code: 'chain_invalid' })
      expect(await port.hasTree({ revisionId })).toBe(false)
    }
    expect(await stagingLeft()).toEqual([])
  })

  it('refuses a set-uid or set-gid root program', async () => {
    for (const mode of [0o4755, 0o2755]) {
      const revisionId = `rev_reviewsetid${mode.toString(8)}`
      const stream = await exported(async (dir) => {
        const file = path.join(dir, 'helper')
        await writeFile(file, '#!/bin/sh\nid\n')
        execFileSync('chown', ['0:0', file])
        await chmod(file, mode)
      })
      expect(await refusal(port.importPoolTree({ revisionId }, 'ten_review', stream))).toMatchObject({
        code: 'chain_invalid',
      })
      expect(await port.hasTree({ revisionId })).toBe(false)
    }
  })

  it('takes what a sandbox can make: an overlay whiteout (0:0), a set-uid file of the sandbox uid', async () => {
    const revisionId = 'rev_reviewinert'
    const stream = await exported(async (dir) => {
      execFileSync('mknod', [path.join(dir, 'whiteout'), 'c', '0', '0'])
      execFileSync('chown', [`${SANDBOX_UID}:${SANDBOX_UID}`, path.join(dir, 'whiteout')])
      const own = path.join(dir, 'own-tool')
      await writeFile(own, '#!/bin/sh\n')
      execFileSync('chown', [`${SANDBOX_UID}:${SANDBOX_UID}`, own])
      await chmod(own, 0o4755)
    })
    await port.importPoolTree({ revisionId }, 'ten_review', stream)
    expect(await port.hasTree({ revisionId })).toBe(true)
  })
})
