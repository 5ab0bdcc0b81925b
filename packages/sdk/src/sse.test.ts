import { describe, expect, it } from 'vitest'
import { readSse, SseParser } from './sse.js'

function parseAll(chunks: string[]) {
  const parser = new SseParser()
  const out = chunks.flatMap((c) => parser.push(c))
  return [...out, ...parser.end()]
}

describe('SseParser', () => {
  it('parses named events with JSON data', () => {
    expect(parseAll(['event: run.started\ndata: {"a":1}\n\n'])).toEqual([
      { event: 'run.started', data: '{"a":1}' },
    ])
  })

  it('defaults the event name to message', () => {
    expect(parseAll(['data: x\n\n'])).toEqual([{ event: 'message', data: 'x' }])
  })

  it('survives every possible chunk boundary', () => {
    const wire = 'event: a\ndata: {"text":"héllo"}\n\nevent: b\r\ndata: 2\r\n\r\n'
    const expected = [
      { event: 'a', data: '{"text":"héllo"}' },
      { event: 'b', data: '2' },
    ]
    for (let cut = 0; cut <= wire.length; cut++) {
      expect(parseAll([wire.slice(0, cut), wire.slice(cut)])).toEqual(expected)
    }
    expect(parseAll(wire.split(''))).toEqual(expected)
  })

  it('treats CR, LF and CRLF as line ends, also when CR and LF are split', () => {
    expect(parseAll(['data: a\r', '\ndata: b\r', '\r', 'data: c\n\n'])).toEqual([
      { event: 'message', data: 'a\nb' },
      { event: 'message', data: 'c' },
    ])
    expect(parseAll(['data: x\r\r'])).toEqual([{ event: 'message', data: 'x' }])
  })

  it('joins multi-line data with newlines', () => {
    expect(parseAll(['data: one\ndata: two\ndata:\ndata: four\n\n'])).toEqual([
      { event: 'message', data: 'one\ntwo\n\nfour' },
    ])
  })

  it('ignores comments, unknown fields and keeps only one leading space', () => {
    expect(parseAll([': keep-alive\nfoo: bar\ndata:  two spaces\n:another\n\n'])).toEqual([
      { event: 'message', data: ' two spaces' },
    ])
  })

  it('handles fields without a colon, id and retry', () => {
    expect(parseAll(['id: 7\nretry: 1500\nretry: x\ndata\n\n'])).toEqual([
      { event: 'message', data: '', id: '7', retry: 1500 },
    ])
  })

  it('does not dispatch an event without data and resets the name', () => {
    expect(parseAll(['event: lonely\n\ndata: after\n\n'])).toEqual([{ event: 'message', data: 'after' }])
  })

  it('drops an unterminated final event', () => {
    expect(parseAll(['data: complete\n\ndata: {"trunc'])).toEqual([{ event: 'message', data: 'complete' }])
  })

  it('strips a leading byte order mark', () => {
    expect(parseAll(['\ufeffdata: x\n\n'])).toEqual([{ event: 'message', data: 'x' }])
  })
})

describe('readSse', () => {
  it('decodes UTF-8 split across byte chunks', async () => {
    const bytes = new TextEncoder().encode('event: d\ndata: ☃ snow\n\n')
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        for (const b of bytes) controller.enqueue(new Uint8Array([b]))
        controller.close()
      },
    })
    const out = []
    for await (const m of readSse(body)) out.push(m)
    expect(out).toEqual([{ event: 'd', data: '☃ snow' }])
  })

  it('cancels the body when the consumer stops early', async () => {
    let cancelled = false
    const body = new ReadableStream<Uint8Array>({
      pull(controller) {
        controller.enqueue(new TextEncoder().encode('data: x\n\n'))
      },
      cancel() {
        cancelled = true
      },
    })
    for await (const _ of readSse(body)) break
    expect(cancelled).toBe(true)
  })
})
