import { readFileSync } from 'node:fs'
import { createInterface } from 'node:readline'
import { CancelledError, UsageError } from './errors.js'

/**
 * Whether this process is in the foreground of its terminal. A job started with `&` still has the
 * terminal as stdin, but reading it (or switching it to raw mode, as a line editor does) stops the
 * whole job ("Stopped (tty input/output)"). Linux: the process group against the terminal's
 * foreground group in /proc/self/stat; where that cannot be read, assumed.
 */
export function inForeground(): boolean {
  try {
    const stat = readFileSync('/proc/self/stat', 'utf8')
    // After "pid (comm) ": state ppid pgrp session tty_nr tpgid …
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    const pgrp = Number(fields[2])
    const foreground = Number(fields[5])
    return foreground > 0 && pgrp === foreground
  } catch {
    return true
  }
}

/** True when stdin is a terminal this process may read: a terminal, and the job is in its foreground. */
export function terminalInput(): boolean {
  return process.stdin.isTTY === true && inForeground()
}

/** True when a person can answer: stdin and stderr are terminals, and this job is in the foreground. */
export function canPrompt(): boolean {
  return process.stderr.isTTY === true && terminalInput()
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

/**
 * Consent to something that cannot be undone (`delete`, `revoke`): `--yes`, or "y" typed on a
 * terminal, where the default (Enter) is No. Without a terminal to ask on (a pipe, `xargs`, cron,
 * `--json` in a script) nothing happens without `--yes`: a recipe that selects the wrong rows then
 * fails safe instead of deleting them.
 */
export async function confirmDestructive(
  question: string,
  options: { yes: boolean | undefined; refused: string; command: string },
): Promise<void> {
  if (options.yes) return
  if (!canPrompt()) {
    throw new UsageError(
      `${options.refused}: there is no terminal to confirm on (stdin is not one)`,
      `Add --yes to run it without asking: \`${options.command} --yes\`.`,
    )
  }
  if (!(await confirm(question, false))) throw new CancelledError(options.refused)
}

/** All of stdin as text (for `echo key | cairn login`). */
export async function readStdin(): Promise<string> {
  const chunks: Buffer[] = []
  for await (const chunk of process.stdin) chunks.push(Buffer.from(chunk as Uint8Array))
  return Buffer.concat(chunks).toString('utf8')
}
