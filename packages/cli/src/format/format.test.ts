import http from 'node:http'
import type { AddressInfo } from 'node:net'
import type { SessionInfo } from '@cairn/protocol'
import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { connectionLost, errorInfo, hintFor, renderError, turnFailureHint } from './errors.js'
import { shortId } from './ids.js'
import { oneLine, stripTerminalEscapes, truncate } from './sanitize.js'
import { SESSION_HEAD, sessionRow } from './session.js'
import { drawnTable, plainTable, renderFields, renderTable } from './table.js'
import { formatBytes, formatDuration, formatSeconds, parseDuration, relativeTime } from './time.js'

const now = new Date('2026-05-01T12:00:00.000Z')
const ago = (ms: number) => new Date(now.getTime() - ms).toISOString()

describe('relativeTime', () => {
  it.each([
    [1000, 'just now'],
    [42_000, '42 seconds ago'],
    [60_000, '1 minute ago'],
    [2 * 60_000, '2 minutes ago'],
    [5 * 60_000, '5 minutes ago'],
    [3600_000, '1 hour ago'],
    [3 * 3600_000, '3 hours ago'],
    [2 * 86400_000, '2 days ago'],
    [65 * 86400_000, '2 months ago'],
    [800 * 86400_000, '2 years ago'],
    [-10 * 60_000, 'in 10 minutes'],
  ])('%d ms ago → %s', (ms, text) => {
    expect(relativeTime(ago(ms), now)).toBe(text)
  })

  it('survives garbage', () => {
    expect(relativeTime('not a date', now)).toBe('-')
  })
})

describe('durations and sizes', () => {
  it('formats durations', () => {
    expect(formatDuration(850)).toBe('850ms')
    expect(formatDuration(1234)).toBe('1.2s')
    expect(formatDuration(59_999)).toBe('59.9s')
    expect(formatDuration(125_000)).toBe('2m 5s')
    expect(formatDuration(3_780_000)).toBe('1h 3m')
    expect(formatDuration(30 * 86_400_000)).toBe('30d')
    expect(formatDuration(2 * 86_400_000 + 4 * 3_600_000)).toBe('2d 4h')
  })
  it('parses durations', () => {
    expect(parseDuration('90s')).toBe(90_000)
    expect(parseDuration('5m')).toBe(300_000)
    expect(parseDuration('1h')).toBe(3_600_000)
    expect(parseDuration('1.5h')).toBe(5_400_000)
    expect(parseDuration('2d')).toBe(172_800_000)
    expect(parseDuration('250ms')).toBe(250)
    expect(parseDuration(' 10 S ')).toBe(10_000)
    expect(parseDuration('0')).toBe(0)
    // A bare number is not guessed: seconds in the hosted docs, milliseconds elsewhere.
    for (const bad of ['3600', '45000', '1.5', '', 'm', '5x', '-5m', '1h30m', '5 minutes', 'Infinity'])
      expect(parseDuration(bad), bad).toBeUndefined()
  })
  it('formats turn durations in seconds, whatever their length', () => {
    expect(formatSeconds(250)).toBe('0.3s')
    expect(formatSeconds(1234)).toBe('1.2s')
    expect(formatSeconds(75_000)).toBe('75.0s')
  })
  it('formats sizes', () => {
    expect(formatBytes(512)).toBe('512 B')
    expect(formatBytes(1536)).toBe('1.5 KB')
    expect(formatBytes(12.3 * 1024 * 1024)).toBe('12.3 MB')
  })
})

describe('shortId', () => {
  it('keeps the prefix and 8 characters: 12 for sessions', () => {
    expect(shortId('ses_0123456789abcdefghjk')).toBe('ses_01234567')
    expect(shortId('ses_0123456789abcdefghjk')).toHaveLength(12)
  })
})

describe('stripTerminalEscapes', () => {
  it('removes colours, cursor moves, titles and hyperlinks but keeps text', () => {
    expect(stripTerminalEscapes('\x1b[31mred\x1b[0m plain')).toBe('red plain')
    expect(stripTerminalEscapes('a\x1b[2J\x1b[H\x1b[10;20Hb')).toBe('ab')
    expect(stripTerminalEscapes('\x1b]0;pwned title\x07text')).toBe('text')
    expect(stripTerminalEscapes('\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\')).toBe('link')
    expect(stripTerminalEscapes('\x9b31mc1 csi')).toBe('c1 csi')
    expect(stripTerminalEscapes('\x1bPdevice control\x1b\\after')).toBe('after')
    expect(stripTerminalEscapes('keypad\x1b=mode\x1b(B')).toBe('keypadmode')
  })

  it('keeps newlines and tabs, folds CRLF, drops lone CR, bells and backspaces', () => {
    expect(stripTerminalEscapes('a\tb\r\nc\n')).toBe('a\tb\nc\n')
    expect(stripTerminalEscapes('fake\rreal\x07\x08')).toBe('fakereal')
  })

  it('keeps unicode text', () => {
    expect(stripTerminalEscapes('héllo ☃ 日本')).toBe('héllo ☃ 日本')
  })

  it('oneLine folds whitespace and truncates', () => {
    expect(oneLine('  a\n\tb  \x1b[1mc ')).toBe('a b c')
    expect(oneLine('abcdef', 4)).toBe('abc…')
    expect(truncate('ab', 5)).toBe('ab')
  })
})

describe('tables', () => {
  it('renders aligned columns without borders', () => {
    const text = renderTable(
      ['ID', 'Name'],
      [
        ['1', 'alpha'],
        ['22', 'b'],
      ],
    )
    expect(text.split('\n')).toEqual(['ID  Name', '1   alpha', '22  b'])
  })

  it('draws a table of printable ASCII without cli-table3 exactly as cli-table3 does', () => {
    const bold = (h: string) => `\x1b[1m${h}\x1b[22m`
    const text = fc.oneof(
      fc.string({
        unit: fc.constantFrom('a', 'Z', '0', ' ', '-', '~', '…', '界', '\t', '\n'),
        maxLength: 12,
      }),
      fc.string({ maxLength: 6 }).map((t) => `\x1b[31m${t}\x1b[39m`),
    )
    const table = fc.integer({ min: 1, max: 5 }).chain((columns) =>
      fc.record({
        head: fc.array(text, { minLength: columns, maxLength: columns }),
        rows: fc.array(fc.array(text, { minLength: columns, maxLength: columns + 1 }), { maxLength: 5 }),
        bold: fc.boolean(),
      }),
    )
    let plain = 0
    fc.assert(
      fc.property(table, ({ head, rows, bold: styled }) => {
        const style = styled ? bold : (h: string) => h
        const fast = plainTable(head, rows, style)
        if (fast === undefined) return
        plain++
        expect(fast).toBe(drawnTable(head, rows, style))
      }),
      { numRuns: 400 },
    )
    // Some generated tables take the plain path (most have a wide character, a tab, a newline …).
    expect(plain).toBeGreaterThan(10)
  })

  it('renders session rows', () => {
    const s: SessionInfo = {
      id: 'ses_0123456789abcdefghjk',
      agentId: 'agt_0123456789abcdefghjk',
      agentName: 'notes',
      revisionId: 'rev_0123456789abcdefghjk',
      title: 'Remember\x1b[31m my cat',
      status: 'idle',
      statusCause: 'turn_completed',
      turnCount: 2,
      messageCount: 4,
      idleTimeoutMs: 1000,
      keepWarmMs: 1000,
      autoSnapshots: true,
      warm: true,
      createdAt: ago(3600_000),
      updatedAt: ago(60_000),
      lastActiveAt: ago(60_000),
    }
    expect(SESSION_HEAD).toEqual(['ID', 'Agent', 'Title', 'Status', 'Msgs', 'Last Active'])
    expect(sessionRow(s, now)).toEqual([
      'ses_01234567',
      'notes',
      'Remember my cat',
      'idle',
      '4',
      '1 minute ago',
    ])
  })

  it('renders fields', () => {
    expect(
      renderFields([
        ['ID', 'x'],
        ['Status', 'idle'],
      ]),
    ).toBe('ID:     x\nStatus: idle')
  })
})

describe('errors', () => {
  it('prints ✗ and a hint matched to the code', () => {
    const text = renderError({ code: 'session_not_found', message: "No session found matching 'zz'" })
    expect(text).toBe("✗ No session found matching 'zz'\n  List your sessions with `cairn sessions list`.")
    expect(text).not.toContain('agent')
  })

  it('hints about agents only for agent errors', () => {
    expect(hintFor('agent_not_found')).toContain('cairn agents list')
    expect(hintFor('ambiguous_id')).toContain('more characters')
    expect(hintFor('connection_error', { apiUrl: 'http://h:1' })).toContain('http://h:1')
    expect(hintFor('unauthorized')).toContain('cairn login')
    expect(hintFor('validation_failed')).toBeUndefined()
  })

  it('prefers an explicit hint and strips escapes from messages', () => {
    expect(renderError({ message: 'bad \x1b[2Jthing', hint: 'do this' })).toBe('✗ bad thing\n  do this')
    expect(errorInfo(new Error('plain'))).toEqual({ code: undefined, message: 'plain' })
    expect(renderError('just a string')).toBe('✗ just a string')
  })
})

describe('a turn that breaks off', () => {
  it('knows a connection the server dropped mid-answer (fetch: terminated) from an error the server sent', async () => {
    // A peer that starts an answer and then dies, as a killed server does mid-turn.
    const server = http.createServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write('event: run.started\ndata: {}\n\n')
      setTimeout(() => res.socket?.destroy(), 50)
    })
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    try {
      const { port } = server.address() as AddressInfo
      const response = await fetch(`http://127.0.0.1:${port}/`)
      const failure = await response.text().then(
        () => undefined,
        (error: unknown) => error,
      )
      expect(failure).toBeInstanceOf(TypeError)
      expect(connectionLost(failure)).toBe(true)
    } finally {
      server.close()
    }
    expect(connectionLost(Object.assign(new Error('busy'), { code: 'session_busy' }))).toBe(false)
    expect(connectionLost(new TypeError('x is not a function'))).toBe(false)
  })

  it('tells what to do after a turn timeout instead of "try again"', () => {
    const hint = turnFailureHint('timeout', 'ses_01234567') ?? ''
    expect(hint).toContain('cairn sessions resume ses_01234567')
    expect(hint).toContain('limits.turnTimeoutMs')
    expect(hint).not.toContain('try again')
  })
})
