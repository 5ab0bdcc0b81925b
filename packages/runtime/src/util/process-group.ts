/**
 * Spawn option for every process the runtime starts (helpers, sandboxes, tools): its own process
 * group, so a signal to the server's group (a terminal's Ctrl-C, `kill -- -PGID`) reaches the
 * server alone, which then stops them in order (turns drained, sandboxes destroyed, mounts
 * undone) instead of finding them dead half-way. Each still ends with the server: helpers at the
 * end of their stdin, sandboxes by `--die-with-parent` and their cgroup, tools by their timeouts.
 */
export const OWN_PROCESS_GROUP = { detached: true } as const
