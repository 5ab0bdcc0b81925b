import { CairnProblem } from '@cairn/protocol'

/**
 * Host uids for bwrap sandboxes, one per running sandbox: a sandbox that gets past the seccomp
 * filter still meets file ownership, because another session's files (stored as the shared sandbox
 * uid) are not its own. Its own workspace it sees through an idmapped mount (idmap-mounter.ts).
 *
 * The default range sits far above login users, systemd's dynamic users (61184–65519) and the
 * subordinate ranges `useradd` hands out (100000 upwards, 65536 per user). A uid owns nothing on
 * disk (every write goes through an idmapped mount and lands as the shared uid; /tmp, /dev/shm and
 * IPC are the sandbox's own) and no process once its sandbox is gone (they die with bwrap, the
 * init of its pid namespace), so it is free again then. The lowest free uid is handed out: the
 * helper's user namespace for that uid is already made (idmap-mounter.ts), and only as many
 * namespaces exist as sandboxes ever ran at once.
 */
export const DEFAULT_SANDBOX_UID_RANGE = { first: 1_600_000_000, count: 100_000 } as const

export class SandboxUids {
  private readonly used = new Set<number>()

  constructor(
    readonly first: number,
    readonly count: number,
  ) {}

  take(): number {
    for (let uid = this.first; uid < this.first + this.count; uid++) {
      if (this.used.has(uid)) continue
      this.used.add(uid)
      return uid
    }
    throw new CairnProblem('unavailable', `all ${this.count} sandbox uids are in use`)
  }

  release(uid: number): void {
    this.used.delete(uid)
  }
}
