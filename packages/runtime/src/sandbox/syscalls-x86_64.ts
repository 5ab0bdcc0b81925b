/**
 * The x86_64 system calls a sandbox may make under bwrap's seccomp filter (and gVisor's OCI one), by
 * what they act on and why that is safe there. Everything else is refused (seccomp.ts): the calls
 * named in `DENIED_SYSCALLS` with EPERM, every other number with ENOSYS, a call a later kernel adds
 * included, as a kernel without it would answer (so a C library falls back to an older call).
 */

/**
 * Names by number, from the kernel's arch/x86/entry/syscalls/syscall_64.tbl up to Linux 6.17:
 * 0–334, then 424–469 (335–423 are unused on x86_64; 512 and up are x32's, refused by the filter).
 */
const NAMES_FROM_0 = `read write open close stat fstat lstat poll lseek mmap mprotect munmap brk rt_sigaction
rt_sigprocmask rt_sigreturn ioctl pread64 pwrite64 readv writev access pipe select sched_yield
mremap msync mincore madvise shmget shmat shmctl dup dup2 pause nanosleep getitimer alarm
setitimer getpid sendfile socket connect accept sendto recvfrom sendmsg recvmsg shutdown bind
listen getsockname getpeername socketpair setsockopt getsockopt clone fork vfork execve exit
wait4 kill uname semget semop semctl shmdt msgget msgsnd msgrcv msgctl fcntl flock fsync
fdatasync truncate ftruncate getdents getcwd chdir fchdir rename mkdir rmdir creat link unlink
symlink readlink chmod fchmod chown fchown lchown umask gettimeofday getrlimit getrusage sysinfo
times ptrace getuid syslog getgid setuid setgid geteuid getegid setpgid getppid getpgrp setsid
setreuid setregid getgroups setgroups setresuid getresuid setresgid getresgid getpgid setfsuid
setfsgid getsid capget capset rt_sigpending rt_sigtimedwait rt_sigqueueinfo rt_sigsuspend
sigaltstack utime mknod uselib personality ustat statfs fstatfs sysfs getpriority setpriority
sched_setparam sched_getparam sched_setscheduler sched_getscheduler sched_get_priority_max
sched_get_priority_min sched_rr_get_interval mlock munlock mlockall munlockall vhangup
modify_ldt pivot_root _sysctl prctl arch_prctl adjtimex setrlimit chroot sync acct settimeofday
mount umount2 swapon swapoff reboot sethostname setdomainname iopl ioperm create_module
init_module delete_module get_kernel_syms query_module quotactl nfsservctl getpmsg putpmsg
afs_syscall tuxcall security gettid readahead setxattr lsetxattr fsetxattr getxattr lgetxattr
fgetxattr listxattr llistxattr flistxattr removexattr lremovexattr fremovexattr tkill time futex
sched_setaffinity sched_getaffinity set_thread_area io_setup io_destroy io_getevents io_submit
io_cancel get_thread_area lookup_dcookie epoll_create epoll_ctl_old epoll_wait_old
remap_file_pages getdents64 set_tid_address restart_syscall semtimedop fadvise64 timer_create
timer_settime timer_gettime timer_getoverrun timer_delete clock_settime clock_gettime
clock_getres clock_nanosleep exit_group epoll_wait epoll_ctl tgkill utimes vserver mbind
set_mempolicy get_mempolicy mq_open mq_unlink mq_timedsend mq_timedreceive mq_notify
mq_getsetattr kexec_load waitid add_key request_key keyctl ioprio_set ioprio_get inotify_init
inotify_add_watch inotify_rm_watch migrate_pages openat mkdirat mknodat fchownat futimesat
newfstatat unlinkat renameat linkat symlinkat readlinkat fchmodat faccessat pselect6 ppoll
unshare set_robust_list get_robust_list splice tee sync_file_range vmsplice move_pages utimensat
epoll_pwait signalfd timerfd_create eventfd fallocate timerfd_settime timerfd_gettime accept4
signalfd4 eventfd2 epoll_create1 dup3 pipe2 inotify_init1 preadv pwritev rt_tgsigqueueinfo
perf_event_open recvmmsg fanotify_init fanotify_mark prlimit64 name_to_handle_at
open_by_handle_at clock_adjtime syncfs sendmmsg setns getcpu process_vm_readv process_vm_writev
kcmp finit_module sched_setattr sched_getattr renameat2 seccomp getrandom memfd_create
kexec_file_load bpf execveat userfaultfd membarrier mlock2 copy_file_range preadv2 pwritev2
pkey_mprotect pkey_alloc pkey_free statx io_pgetevents rseq`
const NAMES_FROM_424 = `pidfd_send_signal io_uring_setup io_uring_enter io_uring_register open_tree move_mount fsopen
fsconfig fsmount fspick pidfd_open clone3 close_range openat2 pidfd_getfd faccessat2
process_madvise epoll_pwait2 mount_setattr quotactl_fd landlock_create_ruleset landlock_add_rule
landlock_restrict_self memfd_secret process_mrelease futex_waitv set_mempolicy_home_node
cachestat fchmodat2 map_shadow_stack futex_wake futex_wait futex_requeue statmount listmount
lsm_get_self_attr lsm_set_self_attr lsm_list_modules mseal setxattrat getxattrat listxattrat
removexattrat open_tree_attr file_getattr file_setattr`

const words = (text: string): string[] => text.split(/\s+/).filter(Boolean)

export const SYSCALL_NUMBERS_X86_64: Readonly<Record<string, number>> = Object.fromEntries([
  ...words(NAMES_FROM_0).map((name, i) => [name, i] as const),
  ...words(NAMES_FROM_424).map((name, i) => [name, 424 + i] as const),
])

/** A group of allowed calls and the reason they are safe inside a sandbox. */
export interface AllowedSyscalls {
  reason: string
  names: readonly string[]
}

export const ALLOWED_SYSCALLS: Readonly<Record<string, AllowedSyscalls>> = {
  files: {
    reason:
      "Files, directories, links and descriptors: they act within the sandbox's own mount namespace, where its mounts and its host uid decide what they reach. `ioctl` passes the rule on btrfs ioctls first.",
    names: words(`read write open close stat fstat lstat poll lseek ioctl pread64 pwrite64 readv writev access
pipe select dup dup2 sendfile fcntl flock fsync fdatasync truncate ftruncate getdents getcwd
chdir fchdir rename mkdir rmdir creat link unlink symlink readlink chmod fchmod chown fchown
lchown umask utime mknod statfs fstatfs chroot sync readahead setxattr lsetxattr fsetxattr
getxattr lgetxattr fgetxattr listxattr llistxattr flistxattr removexattr lremovexattr
fremovexattr getdents64 fadvise64 utimes openat mkdirat mknodat fchownat futimesat newfstatat
unlinkat renameat linkat symlinkat readlinkat fchmodat faccessat pselect6 ppoll splice tee
sync_file_range utimensat fallocate dup3 pipe2 preadv pwritev syncfs renameat2 copy_file_range
preadv2 pwritev2 statx close_range openat2 faccessat2 fchmodat2 setxattrat getxattrat
listxattrat removexattrat file_getattr file_setattr`),
  },
  memory: {
    reason:
      "The process's own address space, within its cgroup's memory limit (`mlock` within RLIMIT_MEMLOCK; memory policies act on its own pages).",
    names: words(`mmap mprotect munmap brk mremap msync mincore madvise mlock munlock mlockall munlockall
remap_file_pages mbind set_mempolicy get_mempolicy set_mempolicy_home_node memfd_create
membarrier mlock2 pkey_mprotect pkey_alloc pkey_free memfd_secret cachestat map_shadow_stack
mseal`),
  },
  processes: {
    reason:
      "Processes and threads of the sandbox's own pid namespace: start, run, wait for, signal, schedule (within its cgroup's pids and CPU limits), a filter of their own. `clone`'s flags meet bwrap's `--disable-userns`; `clone3`'s cannot be read by a filter and meet the same wall.",
    names: words(`clone fork vfork execve exit wait4 kill getpid getppid gettid tkill tgkill exit_group waitid
set_tid_address set_robust_list get_robust_list arch_prctl prctl set_thread_area get_thread_area
execveat clone3 rseq pidfd_open pidfd_send_signal process_mrelease restart_syscall pause
personality seccomp sched_yield sched_setparam sched_getparam sched_setscheduler
sched_getscheduler sched_get_priority_max sched_get_priority_min sched_rr_get_interval
sched_setaffinity sched_getaffinity sched_setattr sched_getattr getpriority setpriority
ioprio_set ioprio_get getrlimit setrlimit prlimit64 getrusage times getcpu`),
  },
  signals: {
    reason: "Signals between the sandbox's own processes.",
    names: words(`rt_sigaction rt_sigprocmask rt_sigreturn rt_sigpending rt_sigtimedwait rt_sigqueueinfo
rt_sigsuspend sigaltstack rt_tgsigqueueinfo signalfd signalfd4`),
  },
  time: {
    reason:
      'Clocks and timers, read and waited on; setting the time needs CAP_SYS_TIME, which no sandbox has (and `settimeofday`, `clock_settime` are refused outright).',
    names:
      words(`nanosleep getitimer alarm setitimer gettimeofday time clock_gettime clock_getres clock_nanosleep
timer_create timer_settime timer_gettime timer_getoverrun timer_delete timerfd_create
timerfd_settime timerfd_gettime adjtimex clock_adjtime`),
  },
  identity: {
    reason:
      "Ids and capabilities inside the sandbox's user namespace, which maps one host uid: a change of id there is no change on the host.",
    names:
      words(`getuid getgid setuid setgid geteuid getegid setpgid getpgrp setsid setreuid setregid getgroups
setgroups setresuid getresuid setresgid getresgid getpgid setfsuid setfsgid getsid capget capset
uname sysinfo getrandom`),
  },
  network: {
    reason:
      "Sockets in the sandbox's own network namespace (loopback, and the egress proxy where a policy allows).",
    names: words(`socket connect accept sendto recvfrom sendmsg recvmsg shutdown bind listen getsockname
getpeername socketpair setsockopt getsockopt accept4 recvmmsg sendmmsg`),
  },
  ipc: {
    reason: "System V and POSIX IPC in the sandbox's own IPC namespace.",
    names: words(`shmget shmat shmctl shmdt semget semop semctl semtimedop msgget msgsnd msgrcv msgctl mq_open
mq_unlink mq_timedsend mq_timedreceive mq_notify mq_getsetattr`),
  },
  events: {
    reason:
      'Waiting on events: epoll, eventfd, inotify, futexes, and the classic asynchronous I/O (`io_uring` is refused).',
    names: words(`epoll_create epoll_wait epoll_ctl epoll_pwait epoll_create1 epoll_pwait2 eventfd eventfd2
inotify_init inotify_add_watch inotify_rm_watch inotify_init1 futex futex_waitv futex_wake
futex_wait futex_requeue io_setup io_destroy io_getevents io_submit io_cancel io_pgetevents
vmsplice`),
  },
  landlock: {
    reason: 'A program may narrow its own access further.',
    names: words(`landlock_create_ruleset landlock_add_rule landlock_restrict_self`),
  },
}

/**
 * Calls the kernel knows that are neither allowed nor refused by name (ENOSYS): obsolete or never
 * implemented (`uselib`, `_sysctl`, `nfsservctl`, the old epoll pair…), the LDT, mount and LSM
 * introspection (`statmount`, `listmount`, `lsm_*`, `open_tree_attr`), the calls that reach another
 * process's memory or descriptors (`migrate_pages`, `process_madvise`, `pidfd_getfd`), `quotactl_fd`,
 * and a `fanotify_mark` no sandbox can use (`fanotify_init` is refused). Listed so a test can show
 * that every known number has a decision.
 */
export const UNLISTED_SYSCALLS: readonly string[] =
  words(`uselib ustat sysfs modify_ldt _sysctl create_module get_kernel_syms query_module nfsservctl
getpmsg putpmsg afs_syscall tuxcall security epoll_ctl_old epoll_wait_old vserver migrate_pages
fanotify_mark pidfd_getfd process_madvise quotactl_fd statmount listmount lsm_get_self_attr
lsm_set_self_attr lsm_list_modules open_tree_attr`)

/** Calls refused with EPERM by name: they manage the host (mounts, modules, keyrings, clocks, reboot), reach other processes (ptrace, process_vm_*, kcmp), or are attack surface no agent needs (bpf, userfaultfd, io_uring, perf events). */
export const DENIED_SYSCALLS: readonly string[] =
  words(`ptrace syslog vhangup pivot_root acct settimeofday mount umount2 swapon swapoff reboot
sethostname setdomainname iopl ioperm init_module delete_module quotactl lookup_dcookie
clock_settime kexec_load add_key request_key keyctl unshare move_pages perf_event_open
fanotify_init name_to_handle_at open_by_handle_at setns process_vm_readv process_vm_writev kcmp
finit_module kexec_file_load bpf userfaultfd open_tree move_mount fsopen fsconfig fsmount fspick
io_uring_setup io_uring_enter io_uring_register mount_setattr`)
