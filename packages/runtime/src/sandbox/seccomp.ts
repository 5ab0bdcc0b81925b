/**
 * A classic-BPF seccomp filter for bwrap's `--seccomp FD`: the container-default deny list on
 * x86_64 (every syscall allowed except those that manage the host: mounts, kernel modules and
 * keyrings, ptrace, bpf, namespaces, clocks, reboot…), which fail with EPERM. Other
 * architectures are killed, so a 32-bit syscall entry cannot bypass the list.
 */
const AUDIT_ARCH_X86_64 = 0xc000003e
const X32_SYSCALL_BIT = 0x40000000
const SECCOMP_RET_ALLOW = 0x7fff0000
const SECCOMP_RET_ERRNO = 0x00050000
const SECCOMP_RET_KILL_PROCESS = 0x80000000
const EPERM = 1
const CLONE_NEWUSER = 0x10000000

const LD_W_ABS = 0x20
const JEQ_K = 0x15
const JGE_K = 0x35
const RET_K = 0x06

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
  // Index of the ERRNO return: after the x32 check, one jump per number and the ALLOW return.
  const errnoIndex = program.length + 1 + numbers.length + 1
  program.push(instruction(JGE_K, errnoIndex - program.length - 1, 0, X32_SYSCALL_BIT))
  for (const nr of numbers) program.push(instruction(JEQ_K, errnoIndex - program.length - 1, 0, nr))
  program.push(instruction(RET_K, 0, 0, SECCOMP_RET_ALLOW))
  program.push(instruction(RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM))
  return Buffer.concat(program)
}

/**
 * The same deny list as an OCI `linux.seccomp` section, for gVisor (`runsc --oci-seccomp` applies it
 * inside its kernel). gVisor lets an unprivileged process make a user namespace, which bwrap's
 * `--disable-userns` forbids; here `clone` with CLONE_NEWUSER is refused as well as `unshare`.
 * `clone3`, whose flags a filter cannot see, is left alone: gVisor does not implement it (ENOSYS),
 * and an ERRNO rule would answer EPERM (runsc ignores `errnoRet`), which stops the C library from
 * falling back to `clone` for threads. test/security/escape.test.ts checks all three ways.
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
    ],
  }
}
