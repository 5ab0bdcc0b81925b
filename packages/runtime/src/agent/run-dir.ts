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
  private turnFileLength = 0

  constructor(
    readonly dir: string,
    /** Where its stderr file goes (`instanceStderrDir`: a tmpfs where the host has one). */
    private readonly stderrDir = path.dirname(dir),
  ) {}

  /**
   * The file the agent's stderr is appended to (drivers that take one: `SandboxSpec.stderrFile`),
   * outside the run dir: the sandbox does not see it.
   */
  get stderrFile(): string {
    return path.join(this.stderrDir, `${path.basename(this.dir)}.stderr`)
  }

  /** A file of the run dir, by name. */
  file(name: string): string {
    return path.join(this.dir, name)
  }

  /** Creates the directory and an empty transcript. */
  create(): void {
    // Synchronous: three metadata operations take microseconds, a thread-pool trip each takes more.
    mkdirSync(this.dir, { recursive: true })
    chmodSync(this.dir, 0o755)
    closeSync(openSync(this.file('transcript.jsonl'), 'w', 0o644))
    // The server's alone (the sandbox writes it through the descriptor its launcher opened).
    closeSync(openSync(this.stderrFile, 'w', 0o600))
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

  /**
   * The transcript before turn `turn` and the turn's number, for the agent to read. Each file is
   * opened for its write and closed after: a warm agent's run dir holds none of the server's
   * descriptors while it waits (issue 33: the server's open-files limit bounds the warm sessions
   * it holds). Neither is truncated when written (ext4 flushes a file truncated from non-empty on
   * its close): the transcript is appended to, the turn number written over in place.
   */
  async writeTranscript(transcript: readonly TranscriptLine[], turn: number): Promise<void> {
    const file = this.file('transcript.jsonl')
    const fresh = transcript.slice(this.transcriptWritten)
    if (transcript.length < this.transcriptWritten) {
      // The history got shorter than what was written (not expected): rewrite it whole.
      const body = transcript.map((line) => `${JSON.stringify(line)}\n`).join('')
      const tmp = this.file(`.transcript.${turn}.tmp`)
      await writeFile(tmp, body, { mode: 0o644 })
      await rename(tmp, file)
    } else if (fresh.length > 0) {
      // Small synchronous writes: cheaper than two trips through the thread pool on the warm path.
      writeOnce(file, 'a', fresh.map((line) => `${JSON.stringify(line)}\n`).join(''))
    }
    this.transcriptWritten = transcript.length
    const text = `${turn}\n`
    // Turn numbers grow, so this shortens the file only if one ever went back.
    writeOnce(this.file('turn'), O_TURN, text, text.length < this.turnFileLength)
    this.turnFileLength = text.length
  }

  /** Removes the directory and the stderr file. */
  async remove(): Promise<void> {
    await rm(this.dir, { recursive: true, force: true })
    await rm(this.stderrFile, { force: true })
  }
}

/** The turn file's flags: written over from its start, never truncated on open. */
const O_TURN = fsConstants.O_WRONLY | fsConstants.O_CREAT

/** Writes `text` to `file` opened with `flags` (at its start, or its end when appending), then closes it. */
function writeOnce(file: string, flags: string | number, text: string, shorten = false): void {
  const fd = openSync(file, flags, 0o644)
  try {
    writeSync(fd, text, flags === 'a' ? null : 0)
    if (shorten) ftruncateSync(fd, Buffer.byteLength(text))
  } finally {
    closeSync(fd)
  }
}
