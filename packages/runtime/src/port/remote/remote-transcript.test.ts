import { createHash } from 'node:crypto'
import { mkdtemp, rm } from 'node:fs/promises'
import http2 from 'node:http2'
import type net from 'node:net'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { newId, type TranscriptLine } from '@cairn/protocol'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { startTcpProxy } from '../../../../../test/helpers/tcp-proxy.js'
import {
  agentSpec,
  makeRevision,
  openTestRuntime,
  sessionId,
  type TestRuntime,
  waitFor,
} from '../../../test/harness.js'
import { LocalRuntimePort } from '../local-runtime-port.js'
import type { AgentSpec } from '../runtime-port.js'
import type { TurnMessage } from '../turn-stream.js'
import { type ClusterTls, initClusterTls, loadClusterTls } from './cluster-tls.js'
import { runWithOwnerEpoch } from './owner-epoch.js'
import { RemoteRuntimePort } from './remote-runtime-port.js'
import { type ServedRuntimePort, serveRuntimePort } from './serve-runtime-port.js'
import { KeptTranscripts, SentTranscripts } from './transcript-wire.js'
import { decodeJson, encodeJson, HEADER, lines, PATH_PREFIX } from './wire.js'

const REVISION = 'rev_transcript'
/** Answers each prompt with the SHA-256 of the transcript file it was given and its line count. */
const READER = [
  'import hashlib, os',
  'while True:',
  '    input()',
  '    data = open(os.environ["CAIRN_TRANSCRIPT"], "rb").read()',
  '    print(hashlib.sha256(data).hexdigest(), data.count(b"\\n"), flush=True)',
  '',
].join('\n')

const FLOOD_REVISION = 'rev_flood'
/** Answers each prompt with 4 MB. */
const FLOOD = 'while True:\n    input()\n    print("x" * 4000000, flush=True)\n'

let t: TestRuntime
let local: LocalRuntimePort
let served: ServedRuntimePort
let clusterDir: string
let apiTls: ClusterTls
const closers: (() => Promise<void>)[] = []

/** A TCP relay in front of the node (it counts the bytes the API side sends through it). */
async function countingRelay(url: string) {
  const proxy = await startTcpProxy(url)
  closers.push(() => proxy.close())
  return { url: proxy.url.replace('http:', 'https:'), proxy }
}

const spec = (id: string): AgentSpec => agentSpec(id, 'ten_tx')

/** What the agent answers for `lines`: their file's SHA-256 (JSON lines) and count. */
function expected(lines: readonly TranscriptLine[]): string {
  const file = lines.map((line) => `${JSON.stringify(line)}\n`).join('')
  return `${createHash('sha256').update(file).digest('hex')} ${lines.length}\n`
}

async function turnText(port: RemoteRuntimePort, id: string, turn: number, transcript: TranscriptLine[]) {
  let text: string | undefined
  const messages: AsyncIterable<TurnMessage> = port.runTurn(
    id,
    { prompt: `p${turn}`, turn, turnId: newId('turn'), transcript },
    { resume: true, keepWarmMs: 60_000 },
  )
  for await (const message of messages)
    if (message.type === 'outcome' && message.outcome.status === 'completed') text = message.outcome.text
  return text
}

beforeAll(async () => {
  t = await openTestRuntime()
  local = new LocalRuntimePort(t.runtime, { clock: { now: () => Date.now() } })
  clusterDir = await mkdtemp(path.join(tmpdir(), 'cairn-port-transcript-'))
  await initClusterTls(clusterDir)
  apiTls = await loadClusterTls(clusterDir, 'api')
  served = await serveRuntimePort(local, {
    host: '127.0.0.1',
    port: 0,
    tls: await loadClusterTls(clusterDir, 'node'),
  })
  await makeRevision(t.runtime, REVISION, { 'agent.py': READER })
  await makeRevision(t.runtime, FLOOD_REVISION, { 'agent.py': FLOOD })
})

afterAll(async () => {
  for (const close of closers) await close()
  await served?.close()
  await local?.stopAllAgents()
  await t?.close()
  if (clusterDir) await rm(clusterDir, { recursive: true, force: true })
})

describe("a turn's transcript over the remote runtime port", () => {
  it('sends only the lines the node was not sent; whole again when the node holds other lines', async () => {
    const relay = await countingRelay(served.url)
    const replica = new RemoteRuntimePort({ url: relay.url, tls: apiTls })
    const other = new RemoteRuntimePort({ url: served.url, tls: apiTls })
    closers.unshift(
      () => replica.close(),
      () => other.close(),
    )
    const id = sessionId('tx')
    // One array, appended to turn by turn, as the server's transcript cache keeps it.
    const transcript: TranscriptLine[] = []
    const say = (turn: number) => {
      transcript.push({ v: 1, role: 'user', turn, content: `question ${turn} ${'q'.repeat(2000)}` })
      transcript.push({ v: 1, role: 'assistant', turn, content: `answer ${turn} ${'a'.repeat(2000)}` })
    }
    await runWithOwnerEpoch(1, async () => {
      await replica.createWorkspace(id, REVISION, 'ten_tx')
      await replica.startAgent(spec(id))
      for (let turn = 1; turn <= 12; turn++) {
        const sentBefore = relay.proxy.bytesToServer
        expect(await turnText(replica, id, turn, transcript)).toBe(expected(transcript))
        // Only the two lines of the turn before cross (~4 KB), not all (20 KB and more from here).
        if (turn >= 6) expect(relay.proxy.bytesToServer - sentBefore).toBeLessThan(12_000)
        say(turn)
      }
      const whole = transcript.reduce((n, line) => n + JSON.stringify(line).length, 0)
      expect(whole).toBeGreaterThan(40_000)

      // Another replica sends the session's transcript with a different last turn, to a fresh
      // sandbox (whose transcript file is written whole): the node now holds those lines.
      await other.stopAgent(id)
      await other.startAgent(spec(id))
      const elsewhere = [
        ...transcript.slice(0, -1),
        { v: 1 as const, role: 'assistant' as const, turn: 12, content: 'x' },
      ]
      expect(await turnText(other, id, 13, elsewhere)).toBe(expected(elsewhere))
      // The first replica's next turn builds on lines the node no longer holds: it is sent whole
      // once more, and the agent of a fresh sandbox reads exactly the first replica's transcript.
      await replica.stopAgent(id)
      await replica.startAgent(spec(id))
      say(13)
      const sentBefore = relay.proxy.bytesToServer
      expect(await turnText(replica, id, 13, transcript)).toBe(expected(transcript))
      expect(relay.proxy.bytesToServer - sentBefore).toBeGreaterThan(whole)
      await replica.deleteWorkspace(id)
    })
  })

  it('a node keeps transcripts up to its budget, the least recently used let go first', () => {
    const kept = new KeptTranscripts(5000)
    const sent = new SentTranscripts()
    const line = (turn: number): TranscriptLine => ({ v: 1, role: 'user', turn, content: 'x'.repeat(1400) })
    const wire = (id: string, transcript: TranscriptLine[]) =>
      sent.wire(id, { prompt: 'p', turn: 1, turnId: 'turn_1', transcript })
    const a = [line(1), line(2)]
    expect(kept.expand('ses_a', wire('ses_a', a).input)?.transcript).toEqual(a)
    a.push(line(3))
    const trimmed = wire('ses_a', a)
    expect(trimmed).toMatchObject({ trimmed: true, input: { transcript: [line(3)] } })
    expect(kept.expand('ses_a', trimmed.input)?.transcript).toEqual(a)
    // Over 5,000 characters with ses_b's: ses_a, the least recently used, goes.
    expect(kept.expand('ses_b', wire('ses_b', [line(1), line(2)]).input)?.transcript).toHaveLength(2)
    expect(kept.size).toBe(1)
    a.push(line(4))
    expect(kept.expand('ses_a', wire('ses_a', a).input)).toBeUndefined()
  })
  it('sends a node of an earlier version, which refuses the lines-after form, every transcript whole', async () => {
    // What an earlier node answers: its schema has no transcriptFrom (bad_request, nothing ran).
    const nodeTls = await loadClusterTls(clusterDir, 'node')
    const seenFrom: boolean[] = []
    const earlier = http2.createSecureServer({ ...nodeTls, requestCert: true, rejectUnauthorized: true })
    earlier.on('stream', async (stream) => {
      stream.on('error', () => undefined)
      const [, input] = decodeJson((await lines(stream)[Symbol.asyncIterator]().next()).value) as [
        string,
        { transcriptFrom?: unknown },
      ]
      seenFrom.push(input.transcriptFrom !== undefined)
      stream.respond({ ':status': 200, 'cairn-kind': 'frames' })
      const frame = input.transcriptFrom
        ? { error: { code: 'bad_request', message: 'runtime port runTurn: argument /1/transcriptFrom' } }
        : { message: { type: 'cold', stopped: false } }
      stream.end(`${encodeJson(frame)}\n`)
    })
    await new Promise<void>((resolve) => earlier.listen(0, '127.0.0.1', resolve))
    closers.push(() => new Promise<void>((resolve) => earlier.close(() => resolve())))
    const replica = new RemoteRuntimePort({
      url: `https://127.0.0.1:${(earlier.address() as net.AddressInfo).port}`,
      tls: apiTls,
    })
    closers.unshift(() => replica.close())
    const transcript: TranscriptLine[] = []
    const cold = async (turn: number) => {
      const got: TurnMessage[] = []
      const input = { prompt: 'p', turn, turnId: newId('turn'), transcript }
      await runWithOwnerEpoch(1, async () => {
        for await (const message of replica.runTurn('ses_earlier', input, { resume: true })) got.push(message)
      })
      transcript.push({ v: 1, role: 'user', turn, content: `q${turn}` })
      return got
    }
    for (let turn = 1; turn <= 4; turn++) expect(await cold(turn)).toEqual([{ type: 'cold', stopped: false }])
    // The third turn tried the line after the second's, was refused and went whole; then always whole.
    expect(seenFrom).toEqual([false, false, true, false, false])
  })

  it("ends the node's turn call when its caller goes away in the middle of a write", async () => {
    // The caller reads nothing of a reply larger than its window, so the node's write waits for
    // a drain; then it goes. Before, the node waited for that drain for ever (the call's handler,
    // the turn's stream and its queued output held).
    const id = sessionId('gone')
    await local.createWorkspace(id, FLOOD_REVISION, 'ten_tx')
    await local.startAgent(spec(id))
    const client = http2.connect(served.url, {
      ca: apiTls.ca,
      cert: apiTls.cert,
      key: apiTls.key,
      checkServerIdentity: () => undefined,
    })
    client.on('error', () => undefined)
    const call = client.request({
      ':method': 'POST',
      ':path': `${PATH_PREFIX}runTurn`,
      [HEADER.ownerEpoch]: '1',
    })
    call.on('error', () => undefined)
    call.end(`${encodeJson([id, { prompt: 'go', turn: 1, turnId: newId('turn'), transcript: [] }, null])}\n`)
    await new Promise((resolve) => call.once('data', resolve))
    call.pause()
    expect(served.callsUnderWay()).toBe(1)
    // The node fills the window and its stream's buffer, then waits.
    await new Promise((resolve) => setTimeout(resolve, 1000))
    client.destroy()
    expect(await waitFor(() => served.callsUnderWay() === 0, 10_000)).toBe(true)
    await local.deleteWorkspace(id)
  })
})
