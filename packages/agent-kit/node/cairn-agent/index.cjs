'use strict'
// Cairn agent kit for the `jsonl` protocol (Node, no dependencies). Present in every sandbox at
// /opt/cairn/node: `require('cairn-agent')` resolves through NODE_PATH, and ES modules import
// '/opt/cairn/node/index.mjs'. See ../index.d.mts for the API.
//
// Frames go to the process's real stdout. Once turns() starts, process.stdout.write (and so
// console.log) goes to stderr instead, so a stray log line cannot break the protocol.

const fs = require('node:fs')
const readline = require('node:readline')

let rawWrite
let current

function channel() {
  if (!rawWrite) {
    rawWrite = process.stdout.write.bind(process.stdout)
    process.stdout.write = process.stderr.write.bind(process.stderr)
  }
  return rawWrite
}

function encode(frame) {
  try {
    return JSON.stringify(frame)
  } catch {
    // A value JSON cannot hold (a BigInt, a cycle): keep the frame, describe the value.
    const seen = new WeakSet()
    return JSON.stringify(frame, (_key, value) => {
      if (typeof value === 'bigint') return value.toString()
      if (value && typeof value === 'object') {
        if (seen.has(value)) return '[Circular]'
        seen.add(value)
      }
      return value
    })
  }
}

function send(frame) {
  channel()(`${encode(frame)}\n`)
}

function errorText(err) {
  if (err instanceof Error) return `${err.name}: ${err.message}`
  return String(err)
}

/** The session's turns before the current one: `{ role, turn, content }` objects, oldest first. */
function transcript() {
  const file = process.env.CAIRN_TRANSCRIPT
  if (!file) return []
  let body
  try {
    body = fs.readFileSync(file, 'utf8')
  } catch (err) {
    if (err && err.code === 'ENOENT') return []
    throw err
  }
  return body
    .split('\n')
    .filter((line) => line.trim())
    .map((line) => JSON.parse(line))
}

class Turn {
  constructor(content, turn, turnId) {
    this.content = content
    this.turn = turn
    this.turnId = turnId
    this.finished = false
    this.tools = 0
  }

  emit(frame) {
    if (this.finished) throw new Error(`turn ${this.turn} is already finished`)
    send(frame)
  }

  transcript() {
    return transcript()
  }

  write(text) {
    const content = String(text)
    if (content) this.emit({ type: 'text', content })
  }

  status(message) {
    this.emit({ type: 'status', message: String(message) })
  }

  toolStart(name, input) {
    this.tools++
    const id = `${this.turnId || `t${this.turn}`}_${this.tools}`
    const frame = { type: 'tool.start', id, name: String(name) }
    if (input !== undefined) frame.input = input
    this.emit(frame)
    return id
  }

  toolEnd(id, output, options = {}) {
    const frame = { type: 'tool.end', id }
    if (output !== undefined) frame.output = output
    if (options.isError) frame.isError = true
    this.emit(frame)
  }

  async tool(name, input, fn) {
    const id = this.toolStart(name, input)
    let output
    try {
      output = await fn(input)
    } catch (err) {
      this.toolEnd(id, errorText(err), { isError: true })
      throw err
    }
    this.toolEnd(id, output)
    return output
  }

  metadata(data) {
    this.emit({ type: 'metadata', data: { ...data } })
  }

  done() {
    if (this.finished) return
    send({ type: 'turn.done' })
    this.finished = true
  }

  error(message) {
    if (this.finished) return
    send({ type: 'error', message: message instanceof Error ? message.message : String(message) })
    this.finished = true
  }
}

/** One Turn per user message, for the life of the process. Sends `ready` first. */
async function* turns() {
  channel()
  send({ type: 'ready' })
  const rl = readline.createInterface({ input: process.stdin, crlfDelay: Number.POSITIVE_INFINITY })
  try {
    for await (const raw of rl) {
      const line = raw.trim()
      if (!line) continue
      let frame
      try {
        frame = JSON.parse(line)
      } catch {
        process.stderr.write(`cairn-agent: ignoring a line that is not JSON: ${line.slice(0, 200)}\n`)
        continue
      }
      if (frame?.type !== 'message') continue
      const turn = new Turn(String(frame.content ?? ''), frame.turn ?? 0, frame.turnId ?? '')
      current = turn
      try {
        yield turn
      } finally {
        current = undefined
      }
      turn.done()
    }
  } finally {
    rl.close()
  }
}

/**
 * Wraps `fn` so every call is reported as a tool call on the current turn: tool.start with the
 * first argument as input (further arguments are passed through), tool.end with the result, or with `isError` and the error's text if it throws
 * (the error is thrown again).
 */
function tool(name, fn) {
  const wrapped = async (input, ...rest) => {
    if (!current) throw new Error('cairn-agent: tool() called outside a turn')
    return current.tool(name, input, () => fn(input, ...rest))
  }
  Object.defineProperty(wrapped, 'name', { value: fn.name || String(name) })
  return wrapped
}

/** The turn being answered, if any. */
function currentTurn() {
  return current
}

module.exports = { Turn, turns, tool, transcript, currentTurn }
