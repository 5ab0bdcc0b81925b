import http2, { type ClientHttp2Session, type ClientHttp2Stream } from 'node:http2'
import type { Duplex, Readable } from 'node:stream'
import { CairnProblem } from '@cairn/protocol'
import { Type } from '@sinclair/typebox'
import type { TurnInput } from '../../agent/types.js'
import type { ImageBuildContext } from '../../images/image-builder.js'
import type { RuntimeEvents, RuntimePort, TreeReadOptions } from '../runtime-port.js'
import type { TurnMessage } from '../turn-stream.js'
import { CLUSTER_ROLE_NAMES, type ClusterTls } from './cluster-tls.js'
import type { RuntimeEventFrame } from './event-hub.js'
import { METHODS, type MethodSpec, RELEASE_ADMISSION } from './method-table.js'
import { currentOwnerEpoch } from './owner-epoch.js'
import { SentTranscripts } from './transcript-wire.js'
import {
  CONNECTION_WINDOW_BYTES,
  decodeJson,
  EVENTS_PATH,
  encodeJson,
  type Frame,
  HEADER,
  lines,
  PATH_PREFIX,
  problemOf,
  SESSION_MEMORY_MIB,
  STREAM_WINDOW_BYTES,
} from './wire.js'

export interface RemoteRuntimePortOptions {
  /** The node's address, `https://host:port` (what `serveRuntimePort` answered). */
  url: string
  tls: ClusterTls
  /** Where the node's pause and network events go; without one they are not subscribed to. */
  events?: RuntimeEvents | undefined
  /** A ping every this many ms; one unanswered as long closes the connection (`node_unavailable`). */
  keepaliveMs?: number | undefined
}

const CANCEL = http2.constants.NGHTTP2_CANCEL

const RELEASE_SPEC: MethodSpec = { args: [{ kind: 'json', schema: Type.String() }], result: 'json' }

/** A call under way: its stream, the headers of its answer, and what goes with it locally. */
interface Call {
  stream: ClientHttp2Stream
  response: Promise<http2.IncomingHttpHeaders>
  /** Output lines of the call (`lines` and image build contexts' `log`). */
  onLine: ((line: string) => void) | undefined
  /** Ends the request side and drops the abort listener, once the answer is in. */
  settle(): void
}

/** Its methods are `RuntimePort`'s, installed from the method table (see the end of this file). */
export interface RemoteRuntimePort extends RuntimePort {}

/**
 * The runtime port of a node on another machine (served by `serveRuntimePort`): every call is one
 * HTTP/2 stream over mutual TLS (the node must show a certificate of the cluster CA named
 * `cairn-node`). Calls made inside `runWithOwnerEpoch` carry the session's owner epoch. A node
 * that cannot be reached, or whose connection drops or stops answering pings, is
 * `node_unavailable`; the node's own errors arrive as the `CairnProblem`s they were.
 */
// biome-ignore lint/suspicious/noUnsafeDeclarationMerging: the port's methods are installed from the method table below.
export class RemoteRuntimePort {
  private connection: ClientHttp2Session | undefined
  private closed = false
  private readonly keepaliveMs: number
  /** What each session's turns sent of their transcript: the next sends only what is new. */
  private readonly transcripts = new SentTranscripts()

  constructor(private readonly options: RemoteRuntimePortOptions) {
    this.keepaliveMs = options.keepaliveMs ?? 2000
    if (options.events) this.subscribe(options.events)
  }

  get url(): string {
    return this.options.url
  }

  /** Closes the connection (calls under way fail with `node_unavailable`). */
  async close(): Promise<void> {
    this.closed = true
    const connection = this.connection
    this.connection = undefined
    if (!connection || connection.destroyed) return
    await new Promise<void>((resolve) => {
      connection.close(() => resolve())
      // Streams still open (an event subscription) end now.
      setTimeout(() => connection.destroy(), 100).unref()
    })
  }

  private unavailable(error: unknown): CairnProblem {
    if (error instanceof CairnProblem) return error
    const message = error instanceof Error ? error.message : String(error)
    return new CairnProblem(
      'node_unavailable',
      `runtime node ${this.options.url} is unavailable: ${message}`,
      {
        node: this.options.url,
      },
    )
  }

  /** The connection to the node, opened (or reopened after a drop) on demand. */
  private session(): ClientHttp2Session {
    if (this.closed) throw new CairnProblem('node_unavailable', `the port to ${this.options.url} is closed`)
    const current = this.connection
    if (current && !current.closed && !current.destroyed) return current
    const connection = http2.connect(this.options.url, {
      ca: this.options.tls.ca,
      cert: this.options.tls.cert,
      key: this.options.tls.key,
      // Files and exports stream at the link's speed, not 64 KiB per round trip.
      settings: { initialWindowSize: STREAM_WINDOW_BYTES },
      maxSessionMemory: SESSION_MEMORY_MIB,
      // Nodes are reached by address: their identity is the CA's `cairn-node` certificate.
      checkServerIdentity: (_host, cert) =>
        cert.subject?.CN === CLUSTER_ROLE_NAMES.node
          ? undefined
          : new Error(
              `the peer's certificate names ${cert.subject?.CN ?? 'nobody'}, not ${CLUSTER_ROLE_NAMES.node}`,
            ),
    })
    connection.unref()
    // A node that does not finish the handshake (stopped, cut off) fails the calls waiting on it.
    const connecting = setTimeout(
      () => connection.destroy(new Error(`no connection within ${2 * this.keepaliveMs} ms`)),
      2 * this.keepaliveMs,
    )
    connecting.unref()
    connection.once('connect', () => {
      clearTimeout(connecting)
      // Emitted a tick after the handshake: a node that closed the connection at once has had it
      // destroyed by then, and widening a destroyed session's window throws (uncaught, it killed
      // an API replica: the cluster model test's soak, seed 662845832, sequence 28).
      if (!connection.destroyed) connection.setLocalWindowSize(CONNECTION_WINDOW_BYTES)
    })
    const forget = () => {
      clearTimeout(connecting)
      clearInterval(keepalive)
      if (this.connection === connection) this.connection = undefined
    }
    connection.on('error', forget)
    connection.on('close', forget)
    connection.on('goaway', forget)
    const keepalive = setInterval(() => {
      if (connection.connecting || connection.destroyed || connection.closed) return
      const deadline = setTimeout(
        () => connection.destroy(new Error(`no answer to a ping within ${this.keepaliveMs} ms`)),
        this.keepaliveMs,
      )
      deadline.unref()
      const sent = connection.ping((error) => {
        if (!error) clearTimeout(deadline)
      })
      if (!sent) clearTimeout(deadline)
    }, this.keepaliveMs)
    keepalive.unref()
    this.connection = connection
    return connection
  }

  /** Starts a call now: the arguments as the method table says each one crosses. */
  private start(name: string, spec: MethodSpec, args: readonly unknown[]): Call {
    let onLine: ((line: string) => void) | undefined
    let signal: AbortSignal | undefined
    let body: Readable | undefined
    const wire = spec.args.map((arg, i) => {
      const value = args[i]
      switch (arg.kind) {
        case 'json':
          return value ?? null
        case 'lines':
          onLine = value as (line: string) => void
          return null
        case 'context': {
          const ctx = value as ImageBuildContext
          onLine = ctx.log
          return { timeoutMs: ctx.timeoutMs }
        }
        case 'readOptions': {
          if (!value) return null
          const { signal: readSignal, ...rest } = value as TreeReadOptions
          signal = readSignal
          return rest
        }
        case 'signal':
          signal = value as AbortSignal | undefined
          return null
        default:
          // 'body': the request body.
          body = value as Readable
          return null
      }
    })
    const headers: http2.OutgoingHttpHeaders = { ':method': 'POST', ':path': `${PATH_PREFIX}${name}` }
    const epoch = currentOwnerEpoch()
    if (epoch !== undefined) headers[HEADER.ownerEpoch] = String(epoch)
    const streamsBody = body !== undefined || spec.result === 'duplex'
    if (streamsBody) headers[HEADER.args] = Buffer.from(encodeJson(wire)).toString('base64')
    const stream = this.session().request(headers)
    const response = new Promise<http2.IncomingHttpHeaders>((resolve, reject) => {
      stream.once('response', resolve)
      stream.once('error', reject)
      stream.once('close', () => reject(new Error('the node closed the call before answering')))
    })
    response.catch(() => undefined)
    const abort = () => {
      if (!stream.writableEnded) stream.end(`${encodeJson({ abort: true })}\n`)
    }
    if (body) body.pipe(stream)
    else if (!streamsBody) {
      // Without a signal the arguments and the request's end go in one frame.
      if (!signal) stream.end(`${encodeJson(wire)}\n`)
      else {
        stream.write(`${encodeJson(wire)}\n`)
        if (signal.aborted) abort()
        else signal.addEventListener('abort', abort, { once: true })
      }
    }
    return {
      stream,
      response,
      onLine,
      settle: () => {
        signal?.removeEventListener('abort', abort)
        if (!streamsBody && !stream.writableEnded) stream.end()
      },
    }
  }

  /** The answer's frames: log lines to the call's handler, the turn's messages and result yielded, an error thrown. */
  private async *frames(
    call: Call,
  ): AsyncGenerator<Extract<Frame, { message: unknown } | { result: unknown } | { retry: unknown }>> {
    try {
      await call.response
      for await (const line of lines(call.stream)) {
        const frame = decodeJson(line) as Frame
        if ('log' in frame) call.onLine?.(frame.log)
        else if ('error' in frame) {
          call.settle()
          throw problemOf(frame)
        } else {
          // The answer is in: the request ends (the node ends its answer after it).
          if ('result' in frame || 'retry' in frame) call.settle()
          yield frame
        }
      }
      const reset = call.stream.rstCode
      if (reset !== undefined && reset !== http2.constants.NGHTTP2_NO_ERROR)
        throw new Error(`the call was reset (HTTP/2 error ${reset})`)
    } catch (error) {
      throw this.unavailable(error)
    } finally {
      call.settle()
    }
  }

  private async result(call: Call): Promise<unknown> {
    // Read to the end: a stream dropped before its end would be reset, and a reset of a stream
    // the node has closed counts against the connection.
    let result: { value: unknown } | undefined
    for await (const frame of this.frames(call))
      if ('result' in frame) result = { value: frame.result ?? undefined }
    if (!result) throw this.unavailable(new Error('the call ended without its result'))
    return result.value
  }

  /** Waits for a byte stream's answer: its headers, or the error the node answered instead. */
  private async bytes(
    call: Call,
  ): Promise<{ stream: ClientHttp2Stream; headers: http2.IncomingHttpHeaders }> {
    let headers: http2.IncomingHttpHeaders
    try {
      headers = await call.response
    } catch (error) {
      throw this.unavailable(error)
    }
    if (headers[HEADER.kind] === 'bytes') {
      // From here the caller stops the bytes by destroying the stream (a reset), not by a signal.
      call.settle()
      return { stream: call.stream, headers }
    }
    await this.result(call)
    throw this.unavailable(new Error('the node answered no byte stream'))
  }

  /** One call of the port, as its entry in the method table says it crosses. */
  invoke(name: keyof RuntimePort, args: readonly unknown[]): unknown {
    const spec = METHODS[name]
    if (spec.result === 'turn') return this.turn(name, spec, args)
    const run = async (): Promise<unknown> => {
      const call = this.start(name, spec, args)
      switch (spec.result) {
        case 'json':
          return this.result(call)
        case 'admission': {
          const { token } = (await this.result(call)) as { token: string }
          return async () => {
            await this.result(this.start(RELEASE_ADMISSION, RELEASE_SPEC, [token]))
          }
        }
        case 'file': {
          const { stream, headers } = await this.bytes(call)
          return { size: Number(headers[HEADER.size]), stream }
        }
        case 'stream':
          return (await this.bytes(call)).stream as Readable
        case 'export': {
          const { stream } = await this.bytes(call)
          return {
            stream,
            stop: async () => {
              if (!stream.closed) stream.close(CANCEL)
            },
          }
        }
        case 'duplex':
          return (await this.bytes(call)).stream as Duplex
      }
    }
    return run().catch((error: unknown) => {
      throw this.unavailable(error)
    })
  }

  /**
   * A turn: started at once, its transcript as the lines the node was not sent yet (sent whole
   * once more when the node asks: it holds other lines); a reader that stops before the outcome
   * resets the call, which cancels it.
   */
  private turn(name: string, spec: MethodSpec, args: readonly unknown[]): AsyncIterable<TurnMessage> {
    const [sessionId, input, options] = args as [string, TurnInput, unknown]
    const open = (whole: boolean) => {
      const sent = this.transcripts.wire(sessionId, input, whole)
      return { call: this.start(name, spec, [sessionId, sent.input, options]), trimmed: sent.trimmed }
    }
    let first: { call: Call; trimmed: boolean } | undefined
    let failed: unknown
    try {
      first = open(false)
    } catch (error) {
      failed = error
    }
    const port = this
    return {
      async *[Symbol.asyncIterator]() {
        if (!first) throw port.unavailable(failed)
        let { call, trimmed } = first
        let done = false
        try {
          for (;;) {
            let retry = false
            let yielded = false
            try {
              for await (const frame of port.frames(call)) {
                if ('retry' in frame) retry = true
                if (!('message' in frame)) continue
                const message = frame.message as TurnMessage
                done = message.type === 'outcome' || message.type === 'cold'
                yielded = true
                yield message
              }
            } catch (error) {
              // A node of an earlier version (upgrades go replicas first) refuses the lines-after
              // form, before anything ran: it is sent transcripts whole from now on.
              const refused = error instanceof CairnProblem && error.code === 'bad_request'
              if (!trimmed || yielded || !refused) throw error
              port.transcripts.sendWhole()
              retry = true
            }
            if (!retry || done) break
            // Asked once, after lines it did not hold; sent whole, the node has all it needs.
            if (!trimmed) throw port.unavailable(new Error('the node asked again for a whole transcript'))
            ;({ call, trimmed } = open(true))
          }
          // The call ended without the turn's outcome: the link to the node went.
          if (!done) throw port.unavailable(new Error("the call ended before the turn's outcome"))
        } finally {
          if (!done && !call.stream.closed) call.stream.close(CANCEL)
        }
      },
    }
  }

  /** Relays the node's events to `events`, resubscribing after a drop until the port is closed. */
  private subscribe(events: RuntimeEvents): void {
    if (this.closed) return
    const listen = async () => {
      const stream = this.session().request({ ':method': 'GET', ':path': EVENTS_PATH })
      stream.on('error', () => undefined)
      stream.end()
      for await (const line of lines(stream)) {
        const frame = decodeJson(line) as RuntimeEventFrame
        if (frame.kind === 'pause') events.pause(frame.sessionId, frame.event)
        else if (frame.kind === 'network') events.network(frame.sessionId, frame.event)
      }
    }
    void listen()
      .catch(() => undefined)
      .finally(() => {
        if (!this.closed) setTimeout(() => this.subscribe(events), 1000).unref()
      })
  }
}

for (const name of Object.keys(METHODS) as (keyof RuntimePort)[]) {
  Object.defineProperty(RemoteRuntimePort.prototype, name, {
    value: function (this: RemoteRuntimePort, ...args: unknown[]) {
      return this.invoke(name, args)
    },
    writable: true,
    configurable: true,
  })
}
