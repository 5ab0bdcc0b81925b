import { readdirSync } from 'node:fs'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { closeOwned } from '../helpers/pool-owners.js'
import { makeProject } from '../helpers/projects.js'
import { packDir, startTestServer, type TestServer } from '../helpers/server.js'

// Issue 28, "one budget per tenant" over the pool's environments: a revision's dependency install
// runs the tenant's own scripts (npm's postinstall here) and writes its environment, which only
// that tenant's revisions use (its key hashes the tenant). It was made in the pool's group of no
// tenant, without a limit: an install could write past the tenant's quota into the agents' share
// of the pool, and its bytes counted for nobody. Now the environment counts in its tenant's group.
const MiB = 1024 * 1024
const TENANT_MIB = 32
let t: TestServer

beforeAll(async () => {
  t = await startTestServer({
    server: { tenantQuotaMiB: TENANT_MIB, workspaceQuotaMiB: 0, rateLimitPerSecond: 0 },
  })
}, 60_000)

afterAll(async () => {
  await closeOwned(t)
})

/** An npm project whose install writes `mib` MiB into its environment. */
function writingInstall(name: string, mib: number): Promise<string> {
  const scripts = { postinstall: `head -c ${mib * MiB} /dev/zero > fill` }
  return makeProject({
    'cairn.yaml': `name: ${name}\ncommand: cat\n`,
    'package.json': JSON.stringify({ name, version: '1.0.0', private: true, scripts }),
  })
}

async function deploy(name: string, mib: number) {
  const res = await t.api.call('POST', '/v1/agents?wait=true', await packDir(await writingInstall(name, mib)))
  expect(res.status, JSON.stringify(res.body)).toBe(201)
  return res.body.revision as { status: string; error: string | null; envKey: string }
}

const usedBytes = async () => (await t.api.call('GET', '/v1/usage')).body.quota.usedBytes as number

describe("a revision's dependency environment", () => {
  it("counts in its tenant's quota", async () => {
    const before = await usedBytes()
    const revision = await deploy('eight', 8)
    expect(revision.status, revision.error ?? '').toBe('READY')
    expect(revision.envKey).toMatch(/^node-/)
    expect(await usedBytes()).toBeGreaterThanOrEqual(before + 8 * MiB)
  })

  it("is stopped at the tenant's quota, and leaves nothing staged", async () => {
    const revision = await deploy('sixty-four', 64)
    expect(revision.status).toBe('FAILED')
    expect(revision.error).toMatch(/quota exceeded/i)
    expect(readdirSync(path.join(t.server.runtime.pool.root, 'staging'))).toEqual([])
    // The pool's group limit lets a write pass it by the kernel's accounting slack.
    expect(await usedBytes()).toBeLessThanOrEqual(TENANT_MIB * MiB + MiB)
  })
})
