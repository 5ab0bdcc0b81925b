import { createInterface } from 'node:readline'

/** True when a person can answer: stdin and stderr are terminals. */
export function canPrompt(): boolean {
  return process.stdin.isTTY === true && process.stderr.isTTY === true
}

export type LineResult = { kind: 'line'; text: string } | { kind: 'eof' } | { kind: 'interrupt' }

/**
 * Reads one line from the terminal with the prompt on stderr. A fresh interface per question leaves
 * the terminal in cooked mode between questions, so Ctrl-C during a turn arrives as SIGINT.
 */
export function askLine(question: string, history: string[] = [], hidden = false): Promise<LineResult> {
  return new Promise((resolve) => {
    const rl = createInterface({
      input: process.stdin,
      output: process.stderr,
      terminal: true,
      history,
      historySize: 500,
      removeHistoryDuplicates: true,
    })
    let settled = false
    const finish = (result: LineResult) => {
      if (settled) return
      settled = true
      if (hidden) process.stderr.write('\n')
      rl.close()
      resolve(result)
    }
    if (hidden) {
      // Print the question, then swallow the echo of what is typed.
      const output = rl as unknown as { _writeToOutput: (s: string) => void }
      process.stderr.write(question)
      output._writeToOutput = () => undefined
    } else {
      rl.setPrompt(question)
      rl.prompt()
    }
    rl.on('line', (text) => finish({ kind: 'line', text }))
    rl.on('SIGINT', () => {
      process.stderr.write('\n')
      finish({ kind: 'interrupt' })
    })
    rl.on('close', () => finish({ kind: 'eof' }))
  })
}

/** Asks yes/no on the terminal; without one, answers `fallback`. */
export async function confirm(question: string, fallback: boolean): Promise<boolean> {
  if (!canPrompt()) return fallback
  const answer = await askLine(`${question} ${fallback ? '[Y/n]' : '[y/N]'} `)
  if (answer.kind !== 'line') return false
  const text = answer.text.trim().toLowerCase()
  return text === '' ? fallback : text === 'y' || text === 'yes'
}

/** All of stdin as text (for `echo key | cairn login`). */
export async function readStdin(): Promise<string> {
  const chunks: Buffer[] = []
  for await (const chunk of process.stdin) chunks.push(Buffer.from(chunk as Uint8Array))
  return Buffer.concat(chunks).toString('utf8')
}
