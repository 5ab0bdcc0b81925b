import type { Socket } from 'node:net'
import { COMMAND_SIGNALS } from '@cairn/protocol'
import fc from 'fast-check'
import WebSocket from 'ws'

/**
 * Generated sessions over the terminal socket (docs/commands.md) for
 * test/security/fuzz-requests.test.ts: every kind of message the socket takes (stdin bytes, the
 * three control messages) and every wrong form of it (wrong types and ranges, text where binary
 * goes and back, text that is no UTF-8, frames past the 1 MiB payload, frames the protocol forbids,
 * fragments, pings, a close in the middle), in any order, against commands of each kind (a shell
 * on a terminal, a plain one reading stdin, one that reads nothing).
 */

/** The terminal socket's input bound (terminal-socket.ts MAX_INPUT_BYTES). */
export const TERMINAL_MAX_INPUT_BYTES = 1024 * 1024

/** What the client does, one step after another, on an open terminal socket. */
export type TerminalStep =
  | { kind: 'stdin'; bytes: number; fill: number }
  | { kind: 'text'; text: string }
  | { kind: 'notUtf8'; bytes: number[] }
  | { kind: 'hugeText'; bytes: number }
  | { kind: 'fragments'; parts: { text: boolean; fin: boolean; bytes: number }[] }
  | { kind: 'ping'; bytes: number }
  | { kind: 'rawFrame'; frame: number[] }
  | { kind: 'close'; code: number }

/** The commands a socket attaches to: each takes (or refuses) input differently. */
export const TERMINAL_COMMANDS = [
  { command: ['sh'], tty: { rows: 24, cols: 80 } },
  { command: ['cat'], stdin: true },
  { command: ['sleep', '30'] },
] as const

const wrongNumber = fc.oneof(
  fc.constantFrom(0, -1, 1001, 1.5, Number.MAX_SAFE_INTEGER, 2 ** 53, '24', null, true, [], {}),
  fc.integer({ min: 1, max: 1000 }),
  fc.jsonValue(),
)
const wrongSignal = fc.oneof(
  fc.constantFrom(...COMMAND_SIGNALS),
  fc.constantFrom('KILL', 'sigkill', 'SIGSTOP', '', 9, null, ['SIGINT'], 'SIGINT\0'),
  fc.jsonValue(),
)
/** A control message: each type with right and wrong fields, extra fields, or no type at all. */
const control = fc.oneof(
  fc.record({ type: fc.constant('resize'), rows: wrongNumber, cols: wrongNumber }),
  fc.record({ type: fc.constant('signal'), signal: wrongSignal }),
  fc.record({ type: fc.constant('close') }),
  fc.record({ type: fc.oneof(fc.constantFrom('RESIZE', 'exit', 'gap', 'error', 'stdin'), fc.jsonValue()) }),
  fc.dictionary(fc.string({ maxLength: 8 }), fc.jsonValue(), { maxKeys: 4 }),
)
const text = fc.oneof(
  control.map((m) => JSON.stringify(m)),
  fc.jsonValue().map((v) => JSON.stringify(v)),
  fc.string({ maxLength: 40 }),
  fc.constantFrom('', '{', '{"type":"resize"', '\u0000', '\ud800', `{"type":"close"}${' '.repeat(4096)}`),
)
/** Frames a client must not send: unmasked, reserved opcodes, RSV bits, long or fragmented control frames, a length past 2^53. */
const forbiddenFrame = fc.constantFrom(
  [0x81, 0x02, 0x68, 0x69],
  [0x83, 0x80, 1, 2, 3, 4],
  [0x8b, 0x80, 1, 2, 3, 4],
  [0xc1, 0x80, 1, 2, 3, 4],
  [0xb1, 0x80, 1, 2, 3, 4],
  [0x09, 0x80, 1, 2, 3, 4],
  [0x89, 0xfe, 0x00, 0x7e, 1, 2, 3, 4, ...Array(126).fill(0)],
  [0x82, 0xff, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4],
  [0x80, 0x80, 1, 2, 3, 4],
  [0x88, 0x81, 1, 2, 3, 4, 0],
  [0x88, 0x82, 0, 0, 0, 0, 0x03, 0xe7],
)

export const terminalStep: fc.Arbitrary<TerminalStep> = fc.oneof(
  fc.record({
    kind: fc.constant('stdin' as const),
    bytes: fc.oneof(
      fc.integer({ min: 0, max: 64 }),
      fc.constantFrom(TERMINAL_MAX_INPUT_BYTES, TERMINAL_MAX_INPUT_BYTES + 1, 4 * TERMINAL_MAX_INPUT_BYTES),
    ),
    fill: fc.integer({ min: 0, max: 255 }),
  }),
  fc.record({ kind: fc.constant('text' as const), text }),
  fc.record({
    kind: fc.constant('notUtf8' as const),
    bytes: fc.constantFrom([0xff], [0xc0, 0xaf], [0xed, 0xa0, 0x80], [0x7b, 0xe2, 0x28, 0xa1, 0x7d]),
  }),
  fc.record({
    kind: fc.constant('hugeText' as const),
    bytes: fc.constantFrom(TERMINAL_MAX_INPUT_BYTES, TERMINAL_MAX_INPUT_BYTES + 1),
  }),
  fc.record({
    kind: fc.constant('fragments' as const),
    parts: fc.array(
      fc.record({ text: fc.boolean(), fin: fc.boolean(), bytes: fc.integer({ min: 0, max: 16 }) }),
      {
        minLength: 1,
        maxLength: 4,
      },
    ),
  }),
  fc.record({ kind: fc.constant('ping' as const), bytes: fc.constantFrom(0, 125) }),
  fc.record({ kind: fc.constant('rawFrame' as const), frame: forbiddenFrame }),
  fc.record({ kind: fc.constant('close' as const), code: fc.constantFrom(1000, 1001, 4000) }),
)

/** What the server did on one socket. */
export interface TerminalRun {
  /** Text messages it sent that are none of the documented ones, or an error it called internal. */
  wrong: string[]
  errors: string[]
  /** The close code it sent (or 1006: the connection ended without one). */
  closeCode: number | undefined
}

const documented = new Set(['error', 'gap', 'exit'])

/** Text no step sends: the server's answer to it (invalid_json, quoting it) comes after every other's. */
const PROBE = 'cairn-terminal-probe'

/**
 * Sends `steps` on a socket to `url`, then a probe, and waits for the probe's answer (the server
 * takes messages in order) or the socket's close, at most `settleMs`; then closes it.
 */
export async function runTerminal(
  url: string,
  key: string,
  steps: readonly TerminalStep[],
  settleMs = 5_000,
): Promise<TerminalRun> {
  const ws = new WebSocket(url, { headers: { authorization: `Bearer ${key}` } })
  const run: TerminalRun = { wrong: [], errors: [], closeCode: undefined }
  let probed = () => {}
  const answered = new Promise<void>((resolve) => {
    probed = resolve
  })
  ws.on('message', (data, binary) => {
    if (binary) return
    if (data.toString().includes(PROBE)) probed()
    let message: { type?: string; error?: { code?: string } }
    try {
      message = JSON.parse(data.toString())
    } catch {
      run.wrong.push(`not JSON: ${data.toString().slice(0, 80)}`)
      return
    }
    if (!documented.has(message.type ?? '')) run.wrong.push(`undocumented: ${data.toString().slice(0, 80)}`)
    if (message.type === 'error') {
      run.errors.push(message.error?.code ?? '')
      if (!message.error?.code || message.error.code === 'internal')
        run.wrong.push(`error: ${data.toString().slice(0, 200)}`)
    }
  })
  // The client's own protocol errors (the server's frames are checked by the client too).
  ws.on('error', (error) => run.wrong.push(`client: ${error.message}`))
  const closed = new Promise<void>((resolve) =>
    ws.once('close', (code) => {
      run.closeCode = code
      resolve()
    }),
  )
  const opened = await Promise.race([
    new Promise<boolean>((resolve) => ws.once('open', () => resolve(true))),
    closed.then(() => false),
  ])
  if (!opened) {
    run.wrong.push('the upgrade was refused')
    return run
  }
  for (const step of steps) {
    if (ws.readyState !== WebSocket.OPEN) break
    send(ws, step)
    await new Promise((resolve) => setImmediate(resolve))
  }
  if (ws.readyState === WebSocket.OPEN) ws.send(PROBE)
  const settle = new Promise((resolve) => setTimeout(resolve, settleMs).unref())
  await Promise.race([closed, answered, settle])
  if (ws.readyState !== WebSocket.CLOSED) {
    ws.terminate()
    await closed
  }
  return run
}

function send(ws: WebSocket, step: TerminalStep): void {
  if (step.kind === 'stdin') ws.send(Buffer.alloc(step.bytes, step.fill), { binary: true })
  else if (step.kind === 'text') ws.send(step.text)
  else if (step.kind === 'notUtf8') ws.send(Buffer.from(step.bytes), { binary: false })
  else if (step.kind === 'hugeText') ws.send(`{"type":"close","pad":"${'x'.repeat(step.bytes)}"}`)
  else if (step.kind === 'fragments')
    for (const part of step.parts)
      ws.send(Buffer.alloc(part.bytes, 0x61), { binary: !part.text, fin: part.fin })
  else if (step.kind === 'ping') ws.ping(Buffer.alloc(step.bytes))
  // Written past the client's framing: what a client of its own could send.
  else if (step.kind === 'rawFrame')
    (ws as unknown as { _socket: Socket })._socket.write(Buffer.from(step.frame))
  else ws.close(step.code)
}
