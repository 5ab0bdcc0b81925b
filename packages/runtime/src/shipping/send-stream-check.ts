import { CairnProblem } from '@cairn/protocol'

const MAGIC = Buffer.from('btrfs-stream\0', 'latin1')
const HEADER_BYTES = MAGIC.length + 4
const COMMAND_HEADER_BYTES = 10
/** Version 1 commands are at most 64 KiB; anything far larger is not a stream we wrote. */
const MAX_COMMAND_BYTES = 1024 * 1024

const CMD_SUBVOL = 1
const CMD_SNAPSHOT = 2
const CMD_CLONE = 16
const CMD_END = 21
const ATTR_UUID = 1
const ATTR_PATH = 15
const ATTR_CLONE_UUID = 20

/** What a link's stream must be: a new subvolume, or a snapshot of the link before it. */
export type ExpectedSubvolume =
  | { kind: 'full'; name: string }
  | { kind: 'increment'; name: string; parentUuid: string }

function refuse(why: string): CairnProblem {
  return new CairnProblem('chain_invalid', `the btrfs send stream is refused: ${why}`)
}

/**
 * Reads a `btrfs send` stream (version 1) as it passes to `btrfs receive`, before each piece is
 * handed on, and refuses (`chain_invalid`) one that would reach outside its chain. `btrfs receive`
 * finds a snapshot's parent and a clone's source by UUID anywhere on the filesystem, chroot or not,
 * so an untrusted stream could otherwise build its tree from another session's snapshot in the
 * pool. Here: the stream makes exactly one subvolume, named as the link says; a full stream makes a
 * new one, an increment snapshots the previous link's subvolume; clones come only from the
 * subvolume being made or that parent.
 */
export class SendStreamCheck {
  private pending: Buffer = Buffer.alloc(0)
  private headerSeen = false
  private uuid: string | undefined
  private ended = false

  constructor(private readonly expected: ExpectedSubvolume) {}

  /** The UUID the stream gives its subvolume (the parent UUID of the next link's stream). */
  get subvolumeUuid(): string | undefined {
    return this.uuid
  }

  /** Checks the next piece of the stream; throws before anything it refuses is passed on. */
  push(chunk: Buffer): void {
    this.pending = this.pending.length === 0 ? chunk : Buffer.concat([this.pending, chunk])
    let offset = 0
    if (!this.headerSeen) {
      if (this.pending.length < HEADER_BYTES) return
      if (!this.pending.subarray(0, MAGIC.length).equals(MAGIC)) throw refuse('no btrfs-stream header')
      const version = this.pending.readUInt32LE(MAGIC.length)
      if (version !== 1) throw refuse(`version ${version} (only version 1 is shipped)`)
      this.headerSeen = true
      offset = HEADER_BYTES
    }
    while (!this.ended && this.pending.length - offset >= COMMAND_HEADER_BYTES) {
      const length = this.pending.readUInt32LE(offset)
      if (length > MAX_COMMAND_BYTES) throw refuse(`a command of ${length} bytes`)
      if (this.pending.length - offset < COMMAND_HEADER_BYTES + length) break
      const command = this.pending.readUInt16LE(offset + 4)
      const body = this.pending.subarray(
        offset + COMMAND_HEADER_BYTES,
        offset + COMMAND_HEADER_BYTES + length,
      )
      this.command(command, body)
      offset += COMMAND_HEADER_BYTES + length
    }
    this.pending = this.pending.subarray(offset)
  }

  /** The stream is over: it must have made its subvolume and ended. */
  finish(): void {
    if (!this.uuid) throw refuse('it makes no subvolume')
    if (!this.ended) throw refuse('it stops before its end command')
  }

  private command(command: number, body: Buffer): void {
    if (command === CMD_END) {
      this.ended = true
      return
    }
    const first = this.uuid === undefined
    if (command === CMD_SUBVOL || command === CMD_SNAPSHOT) {
      if (!first) throw refuse('it makes a second subvolume')
      const attrs = attributes(body)
      const name = attrs.get(ATTR_PATH)?.toString('utf8')
      if (name !== this.expected.name) throw refuse(`it makes '${name}', not '${this.expected.name}'`)
      if (command === CMD_SUBVOL && this.expected.kind !== 'full')
        throw refuse('an increment that makes a new subvolume')
      if (command === CMD_SNAPSHOT) {
        if (this.expected.kind !== 'increment') throw refuse('a full link that snapshots a parent')
        const parent = uuidOf(attrs.get(ATTR_CLONE_UUID))
        if (parent !== this.expected.parentUuid)
          throw refuse(`its parent ${parent} is not the previous link's subvolume`)
      }
      const uuid = uuidOf(attrs.get(ATTR_UUID))
      if (!uuid) throw refuse('its subvolume has no UUID')
      this.uuid = uuid
      return
    }
    if (first) throw refuse('it does not start by making its subvolume')
    if (command === CMD_CLONE) {
      const source = uuidOf(attributes(body).get(ATTR_CLONE_UUID))
      const parent = this.expected.kind === 'increment' ? this.expected.parentUuid : undefined
      if (source !== this.uuid && source !== parent)
        throw refuse(`it clones from ${source}, outside its chain`)
    }
  }
}

/** A command's attributes (type, 16-bit length, data), the first of each type. */
function attributes(body: Buffer): Map<number, Buffer> {
  const found = new Map<number, Buffer>()
  let offset = 0
  while (offset + 4 <= body.length) {
    const type = body.readUInt16LE(offset)
    const length = body.readUInt16LE(offset + 2)
    if (offset + 4 + length > body.length) throw refuse('an attribute runs past its command')
    if (!found.has(type)) found.set(type, body.subarray(offset + 4, offset + 4 + length))
    offset += 4 + length
  }
  return found
}

function uuidOf(value: Buffer | undefined): string | undefined {
  return value?.length === 16 ? value.toString('hex') : undefined
}
