import { createHash } from 'node:crypto'
import { CairnProblem, type LastTests, LastTestsSchema } from '@cairn/protocol'
import type { RuntimePort } from '@cairn/runtime/port'
import { Value } from '@sinclair/typebox/value'

/** `.git/HEAD` and a loose ref are a line; anything longer is not git's. */
const MAX_REF_FILE_BYTES = 4096
/** `.git/packed-refs` read at most this far (a larger one: the SHA is left unknown). */
const MAX_PACKED_REFS_BYTES = 1024 * 1024
/** What an agent reports of its last test run (see `LAST_TESTS_PATH`). */
const MAX_LAST_TESTS_BYTES = 16 * 1024
/** Where an agent (or its test command) writes the outcome of its last test run, in /workspace. */
export const LAST_TESTS_PATH = '.cairn/last-tests.json'

const SHA_PATTERN = /^[0-9a-f]{40}(?:[0-9a-f]{24})?$/
/** A branch ref as git allows it, narrowed: no `..`, no empty component, no `.lock` or `@{`. */
const BRANCH_REF_PATTERN = /^refs\/heads\/(?!.*\.\.)(?!.*\/\/)(?!.*@\{)(?!.*\.lock$)[A-Za-z0-9._/+-]{1,200}$/

/**
 * Reads a small regular file of the session's workspace through the runtime's reader (no link is
 * followed at any component: the workspace is the agent's), or undefined when it is not there, is
 * not a regular file, or is larger than `maxBytes`.
 */
async function readSmall(
  runtime: Pick<RuntimePort, 'openFile'>,
  sessionId: string,
  rel: string,
  maxBytes: number,
): Promise<string | undefined> {
  const file = await runtime.openFile({ sessionId }, Buffer.from(rel)).catch((error: unknown) => {
    if (error instanceof CairnProblem) return undefined
    throw error
  })
  if (!file) return undefined
  if (file.size > maxBytes) {
    file.stream.destroy()
    return undefined
  }
  const chunks: Buffer[] = []
  let bytes = 0
  for await (const chunk of file.stream as AsyncIterable<Buffer>) {
    bytes += chunk.length
    if (bytes > maxBytes) {
      file.stream.destroy()
      return undefined
    }
    chunks.push(chunk)
  }
  return Buffer.concat(chunks).toString('utf8')
}

/**
 * The git checkout at /workspace, read from `.git/HEAD` and the refs without running git: its
 * branch (null when detached or unreadable) and commit SHA (null for an unborn branch or a ref
 * that cannot be read). Null when /workspace holds no `.git` directory of regular files.
 */
export async function gitCheckout(
  runtime: Pick<RuntimePort, 'openFile'>,
  sessionId: string,
): Promise<{ branch: string | null; sha: string | null } | null> {
  const head = (await readSmall(runtime, sessionId, '.git/HEAD', MAX_REF_FILE_BYTES))?.trim()
  if (head === undefined) return null
  if (SHA_PATTERN.test(head)) return { branch: null, sha: head }
  const ref = /^ref: (\S+)$/.exec(head)?.[1]
  if (!ref || !BRANCH_REF_PATTERN.test(ref)) return { branch: null, sha: null }
  const branch = ref.slice('refs/heads/'.length)
  const loose = (await readSmall(runtime, sessionId, `.git/${ref}`, MAX_REF_FILE_BYTES))?.trim()
  if (loose !== undefined && SHA_PATTERN.test(loose)) return { branch, sha: loose }
  const packed = await readSmall(runtime, sessionId, '.git/packed-refs', MAX_PACKED_REFS_BYTES)
  for (const line of packed?.split('\n') ?? []) {
    const [sha, name] = line.split(' ')
    if (name === ref && sha && SHA_PATTERN.test(sha)) return { branch, sha }
  }
  return { branch, sha: null }
}

/** The agent's report of its last test run (`.cairn/last-tests.json`), when it is one. */
export async function lastTests(
  runtime: Pick<RuntimePort, 'openFile'>,
  sessionId: string,
): Promise<LastTests | null> {
  const text = await readSmall(runtime, sessionId, LAST_TESTS_PATH, MAX_LAST_TESTS_BYTES)
  if (text === undefined) return null
  let report: unknown
  try {
    report = JSON.parse(text)
  } catch {
    return null
  }
  if (!Value.Check(LastTestsSchema, report)) return null
  return report
}

/**
 * The version of what sets a session up: a hash of the revision's `setup:` command and the
 * session's setup command (null when it has neither). Two sessions set up alike have the same one.
 */
export function setupVersion(
  buildSetup: unknown,
  sessionSetup: readonly string[] | undefined,
): string | null {
  if (buildSetup === undefined && sessionSetup === undefined) return null
  const described = JSON.stringify({ build: buildSetup ?? null, session: sessionSetup ?? null })
  return `sha256:${createHash('sha256').update(described).digest('hex')}`
}
