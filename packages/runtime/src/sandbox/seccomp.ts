import { ALLOWED_SYSCALLS, DENIED_SYSCALLS, SYSCALL_NUMBERS_X86_64 } from './syscalls-x86_64.js'

/**
 * A classic-BPF seccomp filter for bwrap's `--seccomp FD`, an allow list on x86_64: the calls of
 * `ALLOWED_SYSCALLS` (syscalls-x86_64.ts, each group with the reason it is safe in a sandbox) pass;
 * the calls that manage the host (mounts, kernel modules and keyrings, ptrace, bpf, namespaces,
 * clocks, reboot, io_uring…) fail with EPERM; every other number, a call a later kernel adds
 * included, fails with ENOSYS. Every btrfs ioctl fails with EPERM. Other architectures are killed,
 * so a 32-bit syscall entry cannot bypass the list.
 *
 * btrfs ioctls: the workspace is a subvolume of the pool every session shares, and btrfs answers
 * ioctls on any file of it. Some need no privilege (SUBVOL_CREATE makes a subvolume outside the
 * workspace's quota group; the subvolume listing and info calls name other sessions' subvolumes),
 * some only a mount option or file ownership (SNAP_DESTROY_V2 by id reaches any subvolume of the
 * pool). The rule refuses every request whose type byte (bits 8..15) is BTRFS_IOCTL_MAGIC, so
 * ioctls a later kernel adds are refused too; that includes FICLONE, FICLONERANGE, FIDEDUPERANGE
 * and FS_IOC_GET/SETFSLABEL, which share the 0x94 type (a reflink copy still happens through
 * `copy_file_range`, and `cp` falls back to it). The other FS_IOC_* btrfs implements act on the
 * caller's own files with the usual permission checks (flags, fs-verity, FIEMAP) or need
 * CAP_SYS_ADMIN (FITRIM). The kernel reads the request as 32 bits, so only the low word is compared.
 */
const AUDIT_ARCH_X86_64 = 0xc000003e
const X32_SYSCALL_BIT = 0x40000000
const SECCOMP_RET_ALLOW = 0x7fff0000
const SECCOMP_RET_ERRNO = 0x00050000
const SECCOMP_RET_KILL_PROCESS = 0x80000000
const EPERM = 1
const ENOSYS = 38
const CLONE_NEWUSER = 0x10000000
const SYS_IOCTL = 16
/** `_IOC_TYPE` of every btrfs ioctl, in bits 8..15 of the request. */
export const BTRFS_IOCTL_MAGIC = 0x94
const IOC_TYPE_MASK = 0xff00

const LD_W_ABS = 0x20
const AND_K = 0x54
const JEQ_K = 0x15
const JGE_K = 0x35
const JGT_K = 0x25
const JA = 0x05
const RET_K = 0x06
/** Offset of the low 32 bits of `seccomp_data.args[1]` (little-endian): the ioctl request. */
const ARG1_LOW = 16 + 8

const numberOf = (name: string): number => {
  const nr = SYSCALL_NUMBERS_X86_64[name]
  if (nr === undefined) throw new Error(`seccomp: no x86_64 number for ${name}`)
  return nr
}

/** x86_64 syscall numbers refused with EPERM inside sandboxes. */
export const DENIED_SYSCALLS_X86_64: Readonly<Record<string, number>> = Object.fromEntries(
  DENIED_SYSCALLS.map((name) => [name, numberOf(name)]),
)

/** Every allowed name. */
export const ALLOWED_NAMES: readonly string[] = Object.values(ALLOWED_SYSCALLS).flatMap(
  (group) => group.names,
)

/** The allowed numbers as sorted, disjoint, inclusive ranges. */
export function allowedRanges(): [number, number][] {
  const numbers = [...new Set(ALLOWED_NAMES.map(numberOf))].sort((a, b) => a - b)
  const ranges: [number, number][] = []
  for (const nr of numbers) {
    const last = ranges.at(-1)
    if (last && last[1] === nr - 1) last[1] = nr
    else ranges.push([nr, nr])
  }
  return ranges
}

function instruction(code: number, jt: number, jf: number, k: number): Buffer {
  const b = Buffer.alloc(8)
  b.writeUInt16LE(code, 0)
  b.writeUInt8(jt, 2)
  b.writeUInt8(jf, 3)
  b.writeUInt32LE(k >>> 0, 4)
  return b
}

/**
 * The filter program as bytes (`struct sock_filter[]`), or undefined off x86_64. Layout: the arch
 * and x32 checks; the ioctl rule; one block per allowed range (above it: the next block; in it:
 * ALLOW; below it, a gap: a long jump to the refusals); then the EPERM names, ending in ENOSYS.
 * Conditional jumps reach at most 255 instructions ahead, so every one stays within its block.
 */
export function buildSeccompFilter(arch = process.arch): Buffer | undefined {
  if (arch !== 'x64') return undefined
  const denied = Object.values(DENIED_SYSCALLS_X86_64)
  const ranges = allowedRanges()
  const program: Buffer[] = []
  const push = (code: number, jt: number, jf: number, k: number) => program.push(instruction(code, jt, jf, k))
  push(LD_W_ABS, 0, 0, 4) // seccomp_data.arch
  push(JEQ_K, 1, 0, AUDIT_ARCH_X86_64)
  push(RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS)
  push(LD_W_ABS, 0, 0, 0) // seccomp_data.nr
  push(JGE_K, 0, 1, X32_SYSCALL_BIT)
  push(RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM)
  // ioctl: a btrfs request is refused, any other passes.
  push(JEQ_K, 0, 5, SYS_IOCTL)
  push(LD_W_ABS, 0, 0, ARG1_LOW)
  push(AND_K, 0, 0, IOC_TYPE_MASK)
  push(JEQ_K, 0, 1, BTRFS_IOCTL_MAGIC << 8)
  push(RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM)
  push(RET_K, 0, 0, SECCOMP_RET_ALLOW)
  const refusals = program.length + ranges.length * 4
  for (const [low, high] of ranges) {
    push(JGT_K, 3, 0, high) // above: the next block
    push(JGE_K, 0, 1, low)
    push(RET_K, 0, 0, SECCOMP_RET_ALLOW)
    push(JA, 0, 0, refusals - program.length - 1) // a gap below this range
  }
  if (program.length !== refusals) throw new Error('seccomp program layout')
  for (const [i, nr] of denied.entries()) push(JEQ_K, denied.length - i, 0, nr)
  push(RET_K, 0, 0, SECCOMP_RET_ERRNO | ENOSYS)
  push(RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM)
  return Buffer.concat(program)
}

/**
 * The same allow list as an OCI `linux.seccomp` section, for gVisor (`runsc --oci-seccomp` applies it
 * inside its kernel): calls outside it fail with EPERM (runsc ignores `errnoRet`). gVisor lets an
 * unprivileged process make a user namespace, which bwrap's `--disable-userns` forbids; here `clone`
 * passes only without CLONE_NEWUSER, and `unshare` is refused. `clone3`, whose flags a filter
 * cannot see, must answer ENOSYS (runsc 20240729 implements it and would make the namespace), so
 * the C library falls back to `clone` for threads (EPERM would stop that fallback). runsc 20240729
 * ignores `errnoRet`, so the rule is SCMP_ACT_TRACE: with no tracer the call fails with ENOSYS, and
 * no tracer can be (ptrace is refused). test/security/escape.test.ts checks all three ways. btrfs ioctls are refused by their type byte as in the bwrap filter (gVisor
 * does not pass them to the host anyway: it answers ENOTTY); the mask clears the request's upper
 * 32 bits, so they cannot dodge the rule. runsc takes the first rule that matches a call, so that
 * refusal comes before ioctl's allow.
 */
export function buildOciSeccomp(arch = process.arch): Record<string, unknown> | undefined {
  if (arch !== 'x64') return undefined
  const withRules = new Set(['clone', 'clone3', 'ioctl'])
  return {
    defaultAction: 'SCMP_ACT_ERRNO',
    defaultErrnoRet: EPERM,
    architectures: ['SCMP_ARCH_X86_64'],
    syscalls: [
      { names: ALLOWED_NAMES.filter((name) => !withRules.has(name)), action: 'SCMP_ACT_ALLOW' },
      {
        names: ['clone'],
        action: 'SCMP_ACT_ALLOW',
        args: [{ index: 0, value: CLONE_NEWUSER, valueTwo: 0, op: 'SCMP_CMP_MASKED_EQ' }],
      },
      { names: ['clone3'], action: 'SCMP_ACT_TRACE' },
      {
        names: ['ioctl'],
        action: 'SCMP_ACT_ERRNO',
        errnoRet: EPERM,
        args: [
          { index: 1, value: IOC_TYPE_MASK, valueTwo: BTRFS_IOCTL_MAGIC << 8, op: 'SCMP_CMP_MASKED_EQ' },
        ],
      },
      { names: ['ioctl'], action: 'SCMP_ACT_ALLOW' },
    ],
  }
}
