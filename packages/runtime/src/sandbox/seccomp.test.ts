import { existsSync, readFileSync } from 'node:fs'
import { describe, expect, it } from 'vitest'
import { ALLOWED_NAMES, allowedRanges, buildSeccompFilter, DENIED_SYSCALLS_X86_64 } from './seccomp.js'
import { ALLOWED_SYSCALLS, SYSCALL_NUMBERS_X86_64, UNLISTED_SYSCALLS } from './syscalls-x86_64.js'

const HEADER = '/usr/include/x86_64-linux-gnu/asm/unistd_64.h'

/** The filter's answer for a call, run through the program as the kernel would (classic BPF, the instructions it uses). */
function decide(program: Buffer, nr: number, ioctlRequest = 0): number {
  const data = Buffer.alloc(64)
  data.writeUInt32LE(nr, 0)
  data.writeUInt32LE(0xc000003e, 4)
  data.writeUInt32LE(ioctlRequest, 24)
  let a = 0
  for (let pc = 0; pc * 8 < program.length; pc++) {
    const code = program.readUInt16LE(pc * 8)
    const jt = program.readUInt8(pc * 8 + 2)
    const jf = program.readUInt8(pc * 8 + 3)
    const k = program.readUInt32LE(pc * 8 + 4)
    if (code === 0x20) a = data.readUInt32LE(k)
    else if (code === 0x54) a = (a & k) >>> 0
    else if (code === 0x06) return k
    else if (code === 0x05) pc += k
    else if (code === 0x15) pc += a === k ? jt : jf
    else if (code === 0x35) pc += a >= k ? jt : jf
    else if (code === 0x25) pc += a > k ? jt : jf
    else throw new Error(`unexpected instruction ${code}`)
  }
  throw new Error('fell off the program')
}

const ALLOW = 0x7fff0000
const EPERM = 0x00050001
const ENOSYS = 0x00050026

describe.runIf(process.arch === 'x64')('the seccomp allow list', () => {
  const program = buildSeccompFilter()!

  it('gives every number of the kernel a decision: allowed, refused by name, or unlisted', () => {
    const named = new Set([...ALLOWED_NAMES, ...Object.keys(DENIED_SYSCALLS_X86_64), ...UNLISTED_SYSCALLS])
    expect([...named].sort()).toEqual(Object.keys(SYSCALL_NUMBERS_X86_64).sort())
    expect(ALLOWED_NAMES.length + Object.keys(DENIED_SYSCALLS_X86_64).length + UNLISTED_SYSCALLS.length).toBe(
      named.size,
    )
    for (const group of Object.values(ALLOWED_SYSCALLS)) expect(group.reason.length).toBeGreaterThan(20)
  })

  it.runIf(existsSync(HEADER))("numbers every call as this machine's kernel headers do", () => {
    const lines = readFileSync(HEADER, 'utf8').matchAll(/#define __NR_(\w+) (\d+)/g)
    for (const [, name, nr] of lines)
      expect([name, SYSCALL_NUMBERS_X86_64[name!]]).toEqual([name, Number(nr)])
  })

  it('allows each allowed call, refuses the denied ones with EPERM and every other number with ENOSYS', () => {
    const allowed = new Set(ALLOWED_NAMES.map((name) => SYSCALL_NUMBERS_X86_64[name]))
    const denied = new Set(Object.values(DENIED_SYSCALLS_X86_64))
    for (let nr = 0; nr < 1024; nr++) {
      const expected = allowed.has(nr) ? ALLOW : denied.has(nr) ? EPERM : ENOSYS
      expect([nr, decide(program, nr).toString(16)]).toEqual([nr, expected.toString(16)])
    }
    expect(decide(program, 0x40000000 + 1)).toBe(EPERM) // x32
  })

  it('refuses every btrfs ioctl by its type byte and passes the others', () => {
    expect(decide(program, 16, 0x50009401)).toBe(EPERM) // BTRFS_IOC_SNAP_CREATE
    expect(decide(program, 16, 0x40049409)).toBe(EPERM) // FICLONE
    expect(decide(program, 16, 0x5401)).toBe(ALLOW) // TCGETS
    expect(allowedRanges().every(([low, high]) => low <= high)).toBe(true)
  })
})
