'use strict'
// Cairn stdio shim for Node: marks the end of a turn exactly when the agent asks for its next
// input line (readline `question`, `prompt`, the async iterator, or the return of a 'line'
// handler). Preloaded with --require by the runtime; the agent needs no Cairn import.
const mark = process.env.CAIRN_STDIO_MARK
if (mark && process.env.CAIRN_PROTOCOL === 'stdio') {
  const fs = require('node:fs')
  const readline = require('node:readline')
  const promises = require('node:readline/promises')
  let lines = 0
  const ask = () => {
    fs.writeSync(1, `\x1e${mark}:${lines}\x1f`)
  }
  const patched = new Set()
  const patch = (proto) => {
    if (!proto || patched.has(proto)) return
    patched.add(proto)
    const originalQuestion = proto.question
    if (originalQuestion) {
      proto.question = function question(_query, ...rest) {
        ask()
        const callbackIndex = rest.findIndex((arg) => typeof arg === 'function')
        if (callbackIndex >= 0) {
          const callback = rest[callbackIndex]
          rest[callbackIndex] = (answer) => {
            lines++
            callback(answer)
          }
          return originalQuestion.call(this, '', ...rest)
        }
        const result = originalQuestion.call(this, '', ...rest)
        if (result && typeof result.then === 'function') {
          return result.then((answer) => {
            lines++
            return answer
          })
        }
        return result
      }
    }
    const originalPrompt = proto.prompt
    if (originalPrompt) {
      proto.prompt = function prompt() {
        ask()
        if (typeof this.resume === 'function') this.resume()
      }
    }
    const originalIterator = proto[Symbol.asyncIterator]
    if (originalIterator) {
      proto[Symbol.asyncIterator] = function iterator() {
        this.__cairnIterating = true
        let inner
        try {
          inner = originalIterator.call(this)
        } finally {
          this.__cairnIterating = false
        }
        return {
          next() {
            ask()
            return inner.next().then((step) => {
              if (!step.done) lines++
              return step
            })
          },
          return(value) {
            return inner.return ? inner.return(value) : Promise.resolve({ done: true, value })
          },
          throw(error) {
            return inner.throw ? inner.throw(error) : Promise.reject(error)
          },
          [Symbol.asyncIterator]() {
            return this
          },
        }
      }
    }
    const originalOn = proto.on
    const wrapLine = (listener) =>
      function onLine(line) {
        lines++
        let result
        try {
          result = listener.call(this, line)
        } finally {
          if (result && typeof result.then === 'function') {
            result.then(ask, ask)
          } else {
            ask()
          }
        }
        return result
      }
    const addLineListener = (original) =>
      function addListener(event, listener) {
        if (event === 'line' && typeof listener === 'function' && !this.__cairnIterating) {
          if (!this.__cairnAsked) {
            this.__cairnAsked = true
            process.nextTick(ask)
          }
          return original.call(this, event, wrapLine(listener))
        }
        return original.call(this, event, listener)
      }
    proto.on = addLineListener(originalOn)
    proto.addListener = proto.on
  }
  patch(readline.Interface?.prototype)
  patch(promises.Interface?.prototype)
}
