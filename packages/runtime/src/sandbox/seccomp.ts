/**
 * A classic-BPF seccomp filter for bwrap's `--seccomp FD`: the container-default deny list on
 * x86_64 (every syscall allowed except those that manage the host: mounts, kernel modules and
 * keyrings, ptrace, bpf, namespaces, clocks, reboot, io_uring…), plus every btrfs ioctl, which
 * fail with EPERM. Other architectures are killed, so a 32-bit syscall entry cannot bypass the list.
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
const CLONE_NEWUSER = 0x10000000
const SYS_IOCTL = 16
/** `_IOC_TYPE` of every btrfs ioctl, in bits 8..15 of the request. */
export const BTRFS_IOCTL_MAGIC = 0x94
const IOC_TYPE_MASK = 0xff00

const LD_W_ABS = 0x20
const AND_K = 0x54
const JEQ_K = 0x15
const JGE_K = 0x35
const RET_K = 0x06
/** Offset of the low 32 bits of `seccomp_data.args[1]` (little-endian): the ioctl request. */
const ARG1_LOW = 16 + 8

/** x86_64 syscall numbers refused inside sandboxes. */
export const DENIED_SYSCALLS_X86_64: Record<string, number> = {
  ptrace: 101,
  syslog: 103,
  vhangup: 153,
  pivot_root: 155,
  acct: 163,
  settimeofday: 164,
  mount: 165,
  umount2: 166,
  swapon: 167,
  swapoff: 168,
  reboot: 169,
  sethostname: 170,
  setdomainname: 171,
  iopl: 172,
  ioperm: 173,
  init_module: 175,
  delete_module: 176,
  quotactl: 179,
  lookup_dcookie: 212,
  clock_settime: 227,
  kexec_load: 246,
  add_key: 248,
  request_key: 249,
  keyctl: 250,
  unshare: 272,
  move_pages: 279,
  perf_event_open: 298,
  fanotify_init: 300,
  name_to_handle_at: 303,
  open_by_handle_at: 304,
  setns: 308,
  process_vm_readv: 310,
  process_vm_writev: 311,
  kcmp: 312,
  finit_module: 313,
  kexec_file_load: 320,
  bpf: 321,
  userfaultfd: 323,
  open_tree: 428,
  move_mount: 429,
  fsopen: 430,
  fsconfig: 431,
  fsmount: 432,
  fspick: 433,
  io_uring_setup: 425,
  io_uring_enter: 426,
  io_uring_register: 427,
  mount_setattr: 442,
}

function instruction(code: number, jt: number, jf: number, k: number): Buffer {
  const b = Buffer.alloc(8)
  b.writeUInt16LE(code, 0)
  b.writeUInt8(jt, 2)
  b.writeUInt8(jf, 3)
  b.writeUInt32LE(k >>> 0, 4)
  return b
}

/** The filter program as bytes (`struct sock_filter[]`), or undefined off x86_64. */
export function buildSeccompFilter(arch = process.arch): Buffer | undefined {
  if (arch !== 'x64') return undefined
  const numbers = Object.values(DENIED_SYSCALLS_X86_64)
  const program: Buffer[] = []
  program.push(instruction(LD_W_ABS, 0, 0, 4)) // seccomp_data.arch
  program.push(instruction(JEQ_K, 1, 0, AUDIT_ARCH_X86_64))
  program.push(instruction(RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS))
  program.push(instruction(LD_W_ABS, 0, 0, 0)) // seccomp_data.nr
  // Layout after the x32 check and one jump per denied number: the ioctl check (4 instructions),
  // then the ALLOW return, then the ERRNO return. Jumps are relative to the next instruction.
  const allowIndex = program.length + 1 + numbers.length + 4
  const errnoIndex = allowIndex + 1
  const to = (target: number) => target - program.length - 1
  program.push(instruction(JGE_K, to(errnoIndex), 0, X32_SYSCALL_BIT))
  for (const nr of numbers) program.push(instruction(JEQ_K, to(errnoIndex), 0, nr))
  program.push(instruction(JEQ_K, 0, to(allowIndex), SYS_IOCTL))
  program.push(instruction(LD_W_ABS, 0, 0, ARG1_LOW))
  program.push(instruction(AND_K, 0, 0, IOC_TYPE_MASK))
  program.push(instruction(JEQ_K, to(errnoIndex), to(allowIndex), BTRFS_IOCTL_MAGIC << 8))
  program.push(instruction(RET_K, 0, 0, SECCOMP_RET_ALLOW))
  program.push(instruction(RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM))
  if (program.length - 1 !== errnoIndex) throw new Error('seccomp program layout')
  return Buffer.concat(program)
}

/**
 * The same deny list as an OCI `linux.seccomp` section, for gVisor (`runsc --oci-seccomp` applies it
 * inside its kernel). gVisor lets an unprivileged process make a user namespace, which bwrap's
 * `--disable-userns` forbids; here `clone` with CLONE_NEWUSER is refused as well as `unshare`.
 * `clone3`, whose flags a filter cannot see, is left alone: gVisor does not implement it (ENOSYS),
 * and an ERRNO rule would answer EPERM (runsc ignores `errnoRet`), which stops the C library from
 * falling back to `clone` for threads. test/security/escape.test.ts checks all three ways. btrfs
 * ioctls are refused by their type byte as in the bwrap filter (gVisor does not pass them to the
 * host anyway: it answers ENOTTY); the mask clears the request's upper 32 bits, so they cannot
 * dodge the rule.
 */
export function buildOciSeccomp(arch = process.arch): Record<string, unknown> | undefined {
  if (arch !== 'x64') return undefined
  return {
    defaultAction: 'SCMP_ACT_ALLOW',
    architectures: ['SCMP_ARCH_X86_64'],
    syscalls: [
      { names: Object.keys(DENIED_SYSCALLS_X86_64), action: 'SCMP_ACT_ERRNO', errnoRet: EPERM },
      {
        names: ['clone'],
        action: 'SCMP_ACT_ERRNO',
        errnoRet: EPERM,
        args: [{ index: 0, value: CLONE_NEWUSER, valueTwo: CLONE_NEWUSER, op: 'SCMP_CMP_MASKED_EQ' }],
      },
      {
        names: ['ioctl'],
        action: 'SCMP_ACT_ERRNO',
        errnoRet: EPERM,
        args: [
          { index: 1, value: IOC_TYPE_MASK, valueTwo: BTRFS_IOCTL_MAGIC << 8, op: 'SCMP_CMP_MASKED_EQ' },
        ],
      },
    ],
  }
}
