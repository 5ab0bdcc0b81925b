import { configDefaults, defineConfig, mergeConfig } from 'vitest/config'
import base from './vitest.config'

/**
 * The PostgreSQL pass (`npm run test:postgres`): the suite again where the database can behave
 * differently. Left out are the files whose subject never reaches the database, which the SQLite
 * pass proves once: the packages' unit tests, the runtime's own conformance, sandbox and kernel
 * walls, image builds, agent protocols, the MCP translation (its walls run in both passes), a
 * turn's stream held to its client's pace, the sandbox cap's wait, a merge's three-way walk of the
 * workspaces, the browser console, the deployment and object-store harnesses, the files that start a
 * PostgreSQL of their own (the same run in both passes: a server on it, or the pool cut off from it
 * on a veth link), persisted paths and a manifest's git provenance (bind mounts and a workspace
 * read), the guide walk (the claims the approvals, provenance and retention-layers files test,
 * read as a user would), the OpenAI Agents adapter (the commands and files API, run the same on either database),
 * a data dir's and a pool's one-server locks (files and mounts), and forks with memory (gVisor's
 * checkpoints and restores; the rows a fork writes are a plain fork's, and a secret's expiry is
 * read as in test/secrets.test.ts, which both passes run).
 * Also left out: `cairn doctor` and the server's start-up checks (the server it starts is on SQLite
 * in either pass), the SDK packed, installed, type-checked and bundled (its calls are the SDK
 * tests' on both databases), secrets in no process's arguments (how the runtime starts processes,
 * as proxy-secrets and build-envs), the core flow on each workspace store, btrfs and a plain
 * directory (the stores are the runtime's; the rows the flow writes are test/workspace's and
 * test/restart's, which both passes run), the CLI in a pipe (a closed stdout, colour, a mistyped
 * subcommand: the process's own), an SSE stream's heartbeats and no writes after its client left
 * (the HTTP layer's, as a stream held to its client's pace), file downloads over one kept-alive
 * connection (the HTTP layer's heavy-read slots and sockets), one sandbox's egress bounded (the
 * runtime's egress proxy: its tunnels, lookups and host map), the docs' links and the OpenAPI
 * document's conformance (no server at all).
 * A file that starts a server still touches the database, but these only ask it what the other
 * pass already asked; what they test (a syscall refused, a link in an archive, a pixel) is
 * decided below it.
 */
const RUNTIME_ONLY = [
  'packages/**',
  'test/conformance/**',
  'test/console/**',
  'test/deploy/**',
  'test/object-store/**',
  'test/agent-kit.test.ts',
  'test/archive.test.ts',
  'test/cli-interactive.test.ts',
  'test/cli-pipes.test.ts',
  'test/doctor.test.ts',
  'test/docs-links.test.ts',
  'test/examples-frameworks.test.ts',
  'test/faults/disk-full.test.ts',
  'test/faults/hang.test.ts',
  'test/faults/postgres-partition.test.ts',
  'test/faults/postgres.test.ts',
  'test/fork-memory.test.ts',
  'test/guide-walk.test.ts',
  'test/http-agents.test.ts',
  'test/images*.test.ts',
  'test/isolation.test.ts',
  'test/keep-alive-downloads.test.ts',
  'test/limits.test.ts',
  'test/mcp.test.ts',
  'test/merge.test.ts',
  'test/parallel-sessions.test.ts',
  'test/openapi-lint.test.ts',
  'test/openapi-conformance.test.ts',
  'test/openai-agents.test.ts',
  'test/persist.test.ts',
  'test/provenance.test.ts',
  'test/release.test.ts',
  'test/sdk-tarball.test.ts',
  'test/server-lifecycle.test.ts',
  'test/sse-streams.test.ts',
  'test/storage-drivers.test.ts',
  'test/security/argv-secrets.test.ts',
  'test/security/btrfs-ioctl.test.ts',
  'test/security/build-envs.test.ts',
  'test/security/build-network.test.ts',
  'test/security/cli-code-cache.test.ts',
  'test/security/cluster-mtls.test.ts',
  'test/security/data-dir.test.ts',
  'test/security/egress-limits.test.ts',
  'test/security/egress.test.ts',
  'test/security/environment-quota.test.ts',
  'test/security/escape.test.ts',
  'test/security/fork-memory-secrets.test.ts',
  'test/security/fuzz-archive.test.ts',
  'test/security/nul-values.test.ts',
  'test/security/rate-budgets.test.ts',
  'test/security/hostile-node.test.ts',
  'test/security/image-pull-cap.test.ts',
  'test/security/images-quota.test.ts',
  'test/security/images.test.ts',
  'test/security/inherited-fds.test.ts',
  'test/security/listener-admission.test.ts',
  'test/security/manifest-git-links.test.ts',
  'test/security/previews-origin.test.ts',
  'test/security/proxy-secrets.test.ts',
  'test/security/session-uid.test.ts',
  'test/security/shipped-*.test.ts',
  'test/security/stream-backpressure*.test.ts',
  'test/security/tenant-at-limits.test.ts',
  'test/security/workspace-delete.test.ts',
  'test/security/workspace-listing.test.ts',
  'test/security/workspace-reads.test.ts',
]

/**
 * The files that run on a PostgreSQL of their own (the cluster's test beds, two replicas on one
 * database) or only on SQLite (its busy timeout), so in the SQLite pass: each skips all its tests
 * on CAIRN_TEST_DATABASE=postgres. Left out here too, they cost the pass no import (~1.4 s each).
 * Only a file whose every test skips on PostgreSQL belongs here: a test of a listed file that
 * runs on PostgreSQL would run in neither pass.
 */
const RUN_IN_THE_SQLITE_PASS = [
  'test/cluster/api-nodes.test.ts',
  'test/cluster/api-role.test.ts',
  'test/cluster/approvals-replicas.test.ts',
  'test/cluster/commands-replicas.test.ts',
  'test/cluster/moves-bucket.test.ts',
  'test/cluster/moves.test.ts',
  'test/cluster/recover.test.ts',
  'test/cluster/replica-exclusivity.test.ts',
  'test/cluster/replica-stale-route.test.ts',
  'test/cluster/replica-stream-resume.test.ts',
  'test/cluster/replicas.test.ts',
  'test/cluster/webhook-replicas.test.ts',
  'test/faults/sqlite-busy.test.ts',
  'test/security/replica-revocations.test.ts',
]

export default mergeConfig(
  base,
  defineConfig({
    test: { exclude: [...configDefaults.exclude, ...RUNTIME_ONLY, ...RUN_IN_THE_SQLITE_PASS] },
  }),
)
