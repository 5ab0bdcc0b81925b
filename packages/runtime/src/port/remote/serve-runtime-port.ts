import { randomUUID } from 'node:crypto'
import http2, { type Http2Session, type ServerHttp2Stream } from 'node:http2'
import type { AddressInfo } from 'node:net'
import type { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import type { TLSSocket } from 'node:tls'
import { CairnProblem } from '@cairn/protocol'
import { type TSchema, Type } from '@sinclair/typebox'
import { Value } from '@sinclair/typebox/value'
import { drained } from '../../util/drained.js'
import type { RuntimePort } from '../runtime-port.js'
import type { TurnMessage } from '../turn-stream.js'
import { CLUSTER_ROLE_NAMES, type ClusterTls } from './cluster-tls.js'
import type { RuntimeEventHub } from './event-hub.js'
import { METHODS, type MethodSpec, RELEASE_ADMISSION, wireSchema } from './method-table.js'
import { EpochFence, type EpochFloor, runWithOwnerEpoch } from './owner-epoch.js'
import { KeptTranscripts, type WireTurnInput } from './transcript-wire.js'
import {
  CONNECTION_WINDOW_BYTES,
  decodeJson,
  EVENTS_PATH,
  encodeJson,
  errorFrame,
  type Frame,
  HEADER,
  lines,
  PATH_PREFIX,
  SESSION_MEMORY_MIB,
  STREAM_WINDOW_BYTES,
} from './wire.js'

export interface ServeRuntimePortOptions {
  host: string
  /** 0: any free port. */
  port: number
  tls: ClusterTls
  /** The events of the port's runtime (the hub given to its constructor), sent to subscribers. */
  events?: RuntimeEventHub | undefined
  /** True while the node is fenced (it could not renew its lease): every call is `node_fenced`. */
  isFenced?: (() => boolean) | undefined
  /** An API connection that leaves a ping unanswered this long is closed (its admissions released). */
  keepaliveMs?: number | undefined
  /**
   * A session's owner epoch as the cluster's database has it, read at the session's first call in
   * this process: without it a restarted node would take any epoch (see `EpochFloor`).
   */
  epochFloor?: EpochFloor | undefined
}

export interface ServedRuntimePort {
  /** `https://host:port`, as a `RemoteRuntimePort` reaches it. */
  url: string
  /** The calls being answered now (one whose caller went away leaves once its handler sees it). */
  callsUnderWay(): number
  close(): Promise<void>
}

const CANCEL = http2.constants.NGHTTP2_CANCEL
/** How long a connection may take to show its certificate (node:tls waits 120 s by default). */
const HANDSHAKE_TIMEOUT_MS = 10_000
const INTERNAL = http2.constants.NGHTTP2_INTERNAL_ERROR
const RELEASE_SPEC: MethodSpec = {
  args: [{ kind: 'json', schema: Type.String({ maxLength: 64 }) }],
  result: 'json',
}

/** Whether the session's peer showed a certificate of the CA with the API's name. */
function isApi(session: Http2Session | undefined): boolean {
  const socket = session?.socket as TLSSocket | undefined
  if (!socket?.authorized) return false
  return socket.getPeerCertificate()?.subject?.CN === CLUSTER_ROLE_NAMES.api
}

/**
 * Serves a runtime port to the cluster's API replicas: HTTP/2 over mutual TLS (a client must show
 * a certificate of the cluster CA named `cairn-api`), one call per stream, the arguments checked
 * here (the node is a trust boundary), session-keyed calls admitted only under the session's
 * highest owner epoch (see `EpochFence`).
 */
export async function serveRuntimePort(
  port: RuntimePort,
  options: ServeRuntimePortOptions,
): Promise<ServedRuntimePort> {
  const fence = new EpochFence(options.epochFloor)
  const transcripts = new KeptTranscripts()
  const schemas = new Map<string, TSchema>()
  const schemaOf = (name: string, spec: MethodSpec) => {
    const known = schemas.get(name)
    if (known) return known
    const schema = wireSchema(spec)
    schemas.set(name, schema)
    return schema
  }
  /** Admissions not released yet, by token, with the connection that holds them. */
  const admissions = new Map<string, { release: () => Promise<void>; session: Http2Session }>()
  const server = http2.createSecureServer({
    ca: options.tls.ca,
    cert: options.tls.cert,
    key: options.tls.key,
    requestCert: true,
    rejectUnauthorized: true,
    settings: { initialWindowSize: STREAM_WINDOW_BYTES },
    maxSessionMemory: SESSION_MEMORY_MIB,
    // Before its handshake a peer is anyone on the network: it holds a socket this long at most.
    handshakeTimeout: HANDSHAKE_TIMEOUT_MS,
  })
  const keepaliveMs = options.keepaliveMs ?? 5000
  /** The API connections open (node:http2 does not list them): `close` ends them. */
  const connections = new Set<Http2Session>()
  let callsUnderWay = 0
  server.on('session', (session: Http2Session) => {
    if (!isApi(session)) {
      session.destroy()
      return
    }
    connections.add(session)
    // A connection's failure ends its calls (their streams close); nothing else to do with it.
    session.on('error', () => undefined)
    session.setLocalWindowSize(CONNECTION_WINDOW_BYTES)
    const timer = setInterval(() => {
      if (session.destroyed || session.closed) return
      const deadline = setTimeout(() => session.destroy(), keepaliveMs)
      deadline.unref()
      const sent = session.ping((error) => {
        if (!error) clearTimeout(deadline)
      })
      if (!sent) clearTimeout(deadline)
    }, keepaliveMs)
    timer.unref()
    session.on('close', () => {
      connections.delete(session)
      clearInterval(timer)
      // A replica gone (crashed, cut off) holds no slot of the tenant's cap.
      for (const [token, held] of admissions)
        if (held.session === session) {
          admissions.delete(token)
          void held.release().catch(() => undefined)
        }
    })
  })
  server.on('stream', (stream: ServerHttp2Stream, headers) => {
    stream.on('error', () => undefined)
    if (!isApi(stream.session)) {
      stream.close(http2.constants.NGHTTP2_REFUSED_STREAM)
      return
    }
    const path = headers[':path'] ?? ''
    if (path === EVENTS_PATH && options.events) {
      stream.respond({ ':status': 200, [HEADER.kind]: 'frames' })
      const stop = options.events.subscribe((frame) => stream.write(`${encodeJson(frame)}\n`))
      stream.on('close', stop)
      return
    }
    const name = path.startsWith(PATH_PREFIX) ? path.slice(PATH_PREFIX.length) : ''
    void serveCall(stream, name, headers)
  })

  async function serveCall(
    stream: ServerHttp2Stream,
    name: string,
    headers: http2.IncomingHttpHeaders,
  ): Promise<void> {
    let finished = false
    callsUnderWay++
    try {
      await answerCall(stream, name, headers, () => finished)
    } catch (error) {
      fail(stream, error)
    } finally {
      finished = true
      // The answer ends after the request has: a stream closed first would make the caller's
      // late end-of-request an invalid frame, and enough of those close the connection.
      await requestEnd(stream)
      if (!stream.closed && !stream.destroyed && stream.headersSent && !stream.writableEnded) stream.end()
      callsUnderWay--
    }
  }

  async function answerCall(
    stream: ServerHttp2Stream,
    name: string,
    headers: http2.IncomingHttpHeaders,
    isFinished: () => boolean,
  ): Promise<void> {
    if (options.isFenced?.())
      throw new CairnProblem('node_fenced', 'this runtime node is fenced: it could not renew its lease')
    const spec = name === RELEASE_ADMISSION ? RELEASE_SPEC : METHODS[name as keyof RuntimePort]
    if (!spec || (!Object.hasOwn(METHODS, name) && name !== RELEASE_ADMISSION))
      throw new CairnProblem('not_found', `the runtime port has no method '${name}'`)
    const abort = new AbortController()
    stream.on('close', () => {
      if (!isFinished()) abort.abort(new CairnProblem('unavailable', 'the caller went away'))
    })
    const args = await readArgs(stream, spec, headers, abort)
    const schema = schemaOf(name, spec)
    if (!Value.Check(schema, args)) {
      const first = Value.Errors(schema, args).First()
      throw new CairnProblem(
        'bad_request',
        `runtime port ${name}: argument ${first?.path ?? ''} ${first?.message ?? 'is not valid'}`,
      )
    }
    const sessionId = spec.session?.(args)
    let admittedEpoch: number | undefined
    if (sessionId !== undefined) {
      const raw = headers[HEADER.ownerEpoch]
      const epoch = typeof raw === 'string' && /^\d{1,15}$/.test(raw) ? Number(raw) : undefined
      const refused = await fence.admit(sessionId, epoch)
      if (refused) throw new CairnProblem('stale_epoch', refused, { sessionId, epoch: epoch ?? null })
      admittedEpoch = epoch
    }
    const frames = () => {
      if (!stream.headersSent) stream.respond({ ':status': 200, [HEADER.kind]: 'frames' })
    }
    const send = (frame: Frame) => {
      frames()
      if (!stream.closed && !stream.destroyed) stream.write(`${encodeJson(frame)}\n`)
    }
    // A turn's transcript may come as the lines after those kept here (see transcript-wire.ts).
    if (name === 'runTurn') {
      const input = transcripts.expand(sessionId as string, args[1] as WireTurnInput)
      if (!input) return send({ retry: 'transcript' })
      args[1] = input
    }
    const callArgs = spec.args.map((arg, i) => {
      const value = args[i]
      switch (arg.kind) {
        case 'json':
          return value === null ? undefined : value
        case 'lines':
          return (line: string) => send({ log: line })
        case 'context':
          return { ...(value as object), log: (line: string) => send({ log: line }) }
        case 'readOptions':
          return { ...(value as object | null), signal: abort.signal }
        case 'signal':
          return abort.signal
        default:
          // 'body': the request body.
          return stream as Readable
      }
    })
    if (name === RELEASE_ADMISSION) {
      const held = admissions.get(args[0] as string)
      admissions.delete(args[0] as string)
      await held?.release()
      return send({ result: null })
    }
    const method = (port as unknown as Record<string, (...a: unknown[]) => unknown>)[name]
    // The node's port sees the epoch it was called under (`currentOwnerEpoch`): what it records
    // for the session later (a shipped snapshot) is conditioned on it.
    const call = () =>
      admittedEpoch === undefined
        ? method!.apply(port, callArgs)
        : runWithOwnerEpoch(admittedEpoch, () => method!.apply(port, callArgs))
    switch (spec.result) {
      case 'json':
        // undefined (a void method, an agent not there) crosses as null, read back as undefined.
        return send({ result: (await call()) ?? null })
      case 'admission': {
        const release = (await call()) as () => Promise<void>
        const token = randomUUID()
        admissions.set(token, { release, session: stream.session as Http2Session })
        return send({ result: { token } })
      }
      case 'turn':
        return await sendTurn(stream, call() as AsyncIterable<TurnMessage>, send, () =>
          port.cancelTurn(args[0] as string, (args[1] as { turnId: string }).turnId),
        )
      case 'file': {
        const file = (await call()) as { size: number; stream: Readable }
        stream.respond({ ':status': 200, [HEADER.kind]: 'bytes', [HEADER.size]: String(file.size) })
        return await pipeline(file.stream, stream)
      }
      case 'stream': {
        const body = (await call()) as Readable
        stream.respond({ ':status': 200, [HEADER.kind]: 'bytes' })
        return await pipeline(body, stream)
      }
      case 'export': {
        const exported = (await call()) as { stream: Readable; stop: () => Promise<void> }
        stream.respond({ ':status': 200, [HEADER.kind]: 'bytes' })
        try {
          return await pipeline(exported.stream, stream)
        } finally {
          await exported.stop()
        }
      }
      case 'duplex': {
        const socket = (await call()) as NodeJS.ReadWriteStream & { destroy(): void }
        stream.respond({ ':status': 200, [HEADER.kind]: 'bytes' })
        await Promise.all([pipeline(stream, socket), pipeline(socket, stream)]).catch(() => {
          socket.destroy()
          stream.close(CANCEL)
        })
        return
      }
    }
  }

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(options.port, options.host, () => {
      server.off('error', reject)
      resolve()
    })
  })
  const address = server.address() as AddressInfo
  const host = address.family === 'IPv6' ? `[${address.address}]` : address.address
  return {
    url: `https://${host}:${address.port}`,
    callsUnderWay: () => callsUnderWay,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve())
        // Calls under way end now (their callers see the node go, as they would a crash).
        for (const session of connections) session.destroy()
      }),
  }
}

/** Resolves once the request side has ended (what is left of it is read and dropped), or in 10 s. */
async function requestEnd(stream: ServerHttp2Stream): Promise<void> {
  if (stream.readableEnded || stream.closed || stream.destroyed) return
  await new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, 10_000)
    const done = () => {
      clearTimeout(timer)
      resolve()
    }
    stream.once('end', done)
    stream.once('close', done)
    stream.resume()
  })
}

/** The call's arguments: a JSON line of the request body, or a header when the body is a byte stream. */
async function readArgs(
  stream: ServerHttp2Stream,
  spec: MethodSpec,
  headers: http2.IncomingHttpHeaders,
  abort: AbortController,
): Promise<unknown[]> {
  const streamsBody = spec.result === 'duplex' || spec.args.some((a) => a.kind === 'body')
  if (streamsBody) {
    const raw = headers[HEADER.args]
    if (typeof raw !== 'string')
      throw new CairnProblem('bad_request', `the call lacks its ${HEADER.args} header`)
    return asArgs(decodeJson(Buffer.from(raw, 'base64').toString('utf8')))
  }
  const frames = lines(stream)[Symbol.asyncIterator]()
  const first = await frames.next()
  if (first.done) throw new CairnProblem('bad_request', 'the call sent no arguments')
  const args = asArgs(decodeJson(first.value))
  // Later lines are controls: `{"abort":true}` stops the call (its signal) as a reset does.
  void (async () => {
    for (let next = await frames.next(); !next.done; next = await frames.next())
      if ((decodeJson(next.value) as { abort?: unknown })?.abort === true) abort.abort()
  })().catch(() => undefined)
  return args
}

function asArgs(value: unknown): unknown[] {
  if (!Array.isArray(value)) throw new CairnProblem('bad_request', 'the call arguments are not a JSON array')
  return value
}

/** A turn's messages as frames; a caller that goes away cancels the turn. */
async function sendTurn(
  stream: ServerHttp2Stream,
  messages: AsyncIterable<TurnMessage>,
  send: (frame: Frame) => void,
  cancel: () => Promise<void>,
): Promise<void> {
  let done = false
  const onClose = () => {
    if (!done) void cancel().catch(() => undefined)
  }
  stream.on('close', onClose)
  try {
    for await (const message of messages) {
      if (stream.closed || stream.destroyed) break
      send({ message })
      // A caller gone mid-write closes the stream without a drain: the wait ends then too.
      await drained(stream)
    }
  } finally {
    done = true
    stream.off('close', onClose)
  }
}

/** The error as an answer: a frame when the answer can still carry one, else the stream is reset. */
function fail(stream: ServerHttp2Stream, error: unknown): void {
  if (stream.closed || stream.destroyed || stream.writableEnded) return
  if (!stream.headersSent) stream.respond({ ':status': 200, [HEADER.kind]: 'frames' })
  else if (stream.sentHeaders[HEADER.kind] !== 'frames') {
    stream.close(INTERNAL)
    return
  }
  stream.end(`${encodeJson(errorFrame(error))}\n`)
}
