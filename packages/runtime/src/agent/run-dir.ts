import {
  chmodSync,
  closeSync,
  constants as fsConstants,
  ftruncateSync,
  mkdirSync,
  openSync,
  writeSync,
} from 'node:fs'
import { readFile, rename, rm, writeFile } from 'node:fs/promises'
import path from 'node:path'
import type { TranscriptLine } from '@cairn/protocol'
import type { EgressCa } from '../egress/egress-ca.js'

/** Debian's and Ubuntu's bundle of the system's trusted CAs. */
const SYSTEM_CA_BUNDLE = '/etc/ssl/certs/ca-certificates.crt'

/**
 * An agent's run directory on the host, mounted read-only at /run/cairn in its sandbox: the
 * transcript, the turn number, the egress CA, and the sockets of its egress proxy and port relay.
 */
export class RunDir {
  /** Lines of the transcript already in the file: each turn appends only what is new. */
  private transcriptWritten = 0
  /**
   * The transcript (appended to) and `turn` file (overwritten in place), open for the life of the
   * process: an open and a close per file per turn cost more than the write, and truncating a
   * non-empty file makes ext4 (a disk-backed /run) flush it on close.
   */
  private transcriptFd: number | undefined
  private turnFd: number | undefined
  private turnFileLength = 0

  constructor(readonly dir: string) {}

  /** A file of the run dir, by name. */
  file(name: string): string {
    return path.join(this.dir, name)
  }

  /** Creates the directory and an empty transcript. */
  create(): void {
    // Synchronous: three metadata operations take microseconds, a thread-pool trip each takes more.
    mkdirSync(this.dir, { recursive: true })
    chmodSync(this.dir, 0o755)
    const { O_WRONLY, O_CREAT, O_TRUNC, O_APPEND } = fsConstants
    this.transcriptFd = openSync(
      this.file('transcript.jsonl'),
      O_WRONLY | O_CREAT | O_TRUNC | O_APPEND,
      0o644,
    )
  }

  /**
   * The egress CA where the sandbox reads it (/run/cairn): alone for Node's NODE_EXTRA_CA_CERTS, and
   * appended to the system bundle for OpenSSL-based clients, whose variables replace that bundle.
   */
  async writeTrustedCa(ca: EgressCa): Promise<void> {
    let system = ''
    try {
      system = await readFile(SYSTEM_CA_BUNDLE, 'utf8')
    } catch {}
    await writeFile(this.file('egress-ca.pem'), ca.certificatePem, { mode: 0o644 })
    const bundle = `${system}${system.endsWith('\n') || !system ? '' : '\n'}${ca.certificatePem}`
    await writeFile(this.file('ca-bundle.pem'), bundle, { mode: 0o644 })
  }

  /** The transcript before turn `turn` and the turn's number, for the agent to read. */
  async writeTranscript(transcript: readonly TranscriptLine[], turn: number): Promise<void> {
    const file = this.file('transcript.jsonl')
    const fresh = transcript.slice(this.transcriptWritten)
    if (transcript.length < this.transcriptWritten) {
      // The history got shorter than what was written (not expected): rewrite it whole.
      const body = transcript.map((line) => `${JSON.stringify(line)}\n`).join('')
      const tmp = this.file(`.transcript.${turn}.tmp`)
      await writeFile(tmp, body, { mode: 0o644 })
      await rename(tmp, file)
      this.closeFiles()
    } else if (fresh.length > 0) {
      // Small synchronous writes: cheaper than two trips through the thread pool on the warm path.
      this.transcriptFd ??= openSync(file, 'a', 0o644)
      writeSync(this.transcriptFd, fresh.map((line) => `${JSON.stringify(line)}\n`).join(''))
    }
    this.transcriptWritten = transcript.length
    const text = `${turn}\n`
    this.turnFd ??= openSync(this.file('turn'), 'w', 0o644)
    writeSync(this.turnFd, text, 0)
    // Turn numbers grow, so this shortens the file only if one ever went back.
    if (text.length < this.turnFileLength) ftruncateSync(this.turnFd, text.length)
    this.turnFileLength = text.length
  }

  private closeFiles(): void {
    for (const fd of [this.transcriptFd, this.turnFd]) if (fd !== undefined) closeSync(fd)
    this.transcriptFd = undefined
    this.turnFd = undefined
    this.turnFileLength = 0
  }

  /** Closes the open files and removes the directory. */
  async remove(): Promise<void> {
    this.closeFiles()
    await rm(this.dir, { recursive: true, force: true })
  }
}
