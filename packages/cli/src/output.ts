import type { Writable } from 'node:stream'
import pc from 'picocolors'
import { renderError } from './format/errors.js'

type Colors = ReturnType<typeof pc.createColors>

export interface OutputOptions {
  json: boolean
  /**
   * Whether to colour: one answer for both streams, or each stream's own (`useColor` per stream:
   * `--color` and `FORCE_COLOR` colour a pipe too).
   */
  color: boolean | { stdout: boolean; stderr: boolean }
  stdout?: Writable & { isTTY?: boolean }
  stderr?: Writable & { isTTY?: boolean }
}

const SPINNER = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏']

/**
 * Where everything the CLI prints goes: data on stdout (JSON with `--json`), notes and errors on
 * stderr, progress and spinners on stderr only when it is a terminal.
 */
export class Output {
  readonly json: boolean
  /** Colours for stdout and stderr. */
  readonly c: Colors
  readonly ec: Colors
  readonly stdout: Writable & { isTTY?: boolean }
  readonly stderr: Writable & { isTTY?: boolean }
  private spinnerLine: string | undefined

  constructor(options: OutputOptions) {
    this.json = options.json
    this.stdout = options.stdout ?? process.stdout
    this.stderr = options.stderr ?? process.stderr
    const color =
      typeof options.color === 'boolean' ? { stdout: options.color, stderr: options.color } : options.color
    this.c = pc.createColors(color.stdout)
    this.ec = pc.createColors(color.stderr)
  }

  get stdoutIsTty(): boolean {
    return this.stdout.isTTY === true
  }
  get stderrIsTty(): boolean {
    return this.stderr.isTTY === true
  }

  /** A line of human output on stdout. */
  line(text = ''): void {
    this.stdout.write(`${text}\n`)
  }

  write(text: string): void {
    this.stdout.write(text)
  }

  /** Machine-readable data on stdout, one JSON document per call. */
  data(value: unknown): void {
    this.stdout.write(`${JSON.stringify(value, null, this.stdoutIsTty ? 2 : undefined)}\n`)
  }

  /** One JSON value per line (for streams of records). */
  record(value: unknown): void {
    this.stdout.write(`${JSON.stringify(value)}\n`)
  }

  /** Information for the person at the terminal, on stderr. */
  note(text: string): void {
    this.clearSpinner()
    this.stderr.write(`${text}\n`)
  }

  /** Progress: on stderr, only when it is a terminal. */
  progress(text: string): void {
    if (this.stderrIsTty) this.note(this.ec.dim(text))
  }

  error(error: unknown, apiUrl?: string): void {
    this.clearSpinner()
    this.stderr.write(`${renderError(error, apiUrl === undefined ? {} : { apiUrl }, this.ec)}\n`)
  }

  /**
   * A step of a long command (packing, uploading, building): a spinner on a terminal; otherwise one
   * line on stderr, so that a log or a CI job shows where the command is.
   */
  step(text: string): { update(text: string): void; stop(): void } {
    if (this.stderrIsTty) return this.spinner(text)
    this.note(this.ec.dim(text))
    return { update: () => undefined, stop: () => undefined }
  }

  /** A spinner on stderr when it is a terminal; nothing otherwise. */
  spinner(text: string): { update(text: string): void; stop(): void } {
    if (!this.stderrIsTty) return { update: () => undefined, stop: () => undefined }
    let frame = 0
    let label = text
    const draw = () => {
      this.spinnerLine = `${this.ec.cyan(SPINNER[frame++ % SPINNER.length] ?? '')} ${label}`
      this.stderr.write(`\r\x1b[2K${this.spinnerLine}`)
    }
    draw()
    const timer = setInterval(draw, 80)
    timer.unref()
    return {
      update: (next) => {
        label = next
        draw()
      },
      stop: () => {
        clearInterval(timer)
        this.clearSpinner()
      },
    }
  }

  private clearSpinner(): void {
    if (this.spinnerLine === undefined) return
    this.spinnerLine = undefined
    this.stderr.write('\r\x1b[2K')
  }
}
