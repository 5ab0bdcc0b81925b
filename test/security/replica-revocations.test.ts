import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type ApiReplicas, startApiReplicas } from '../helpers/api-replicas.js'
import { testsRunOnPostgres } from '../helpers/postgres.js'
import { rawPreviewUpgrade, UPGRADE_ECHO_PY } from '../helpers/preview.js'
import { makeProject, SHELL_PROJECT } from '../helpers/projects.js'
import { Api } from '../helpers/server.js'

// Two API replicas (`--role api`) on one PostgreSQL, in front of a runtime node. A revocation
// answered by one replica must hold on the other: a revoked API key is refused there too (each replica keeps verified keys in memory), and a
// WebSocket it relays for a preview port whose URLs were revoked is closed (each replica holds its
// own relayed connections). What crosses is a hint over LISTEN/NOTIFY; a replica that could have
// missed one does not trust what it remembers.

let cluster: ApiReplicas

beforeAll(async () => {
  cluster = await startApiReplicas(2, 'replica-revocations')
}, 180_000)

afterAll(async () => {
  await cluster?.close()
})

const until = async (done: () => Promise<boolean> | boolean, timeoutMs = 5000) => {
  const deadline = Date.now() + timeoutMs
  while (!(await done()) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 25))
}

// On a PostgreSQL of its own in either pass of the suite: run once (the SQLite pass).
describe.skipIf(testsRunOnPostgres())('revocations across API replicas', () => {
  it('a key revoked through one replica is refused by the other, which had verified it before', async () => {
    const one = cluster.api(0)
    const created = await one.call('POST', '/v1/keys', { name: 'short-lived' })
    expect(created.status).toBe(201)
    const { id, key } = created.body as { id: string; key: string }
    const onTwo = new Api(cluster.replicas[1]?.url ?? '', key)
    // Verified (and remembered) by the other replica, several times.
    for (let i = 0; i < 3; i++) expect((await onTwo.call('GET', '/v1/sessions')).status).toBe(200)
    expect((await one.call('DELETE', `/v1/keys/${id}`)).status).toBe(200)
    let status = 0
    await until(async () => {
      status = (await onTwo.call('GET', '/v1/sessions')).status
      return status === 401
    })
    expect(status).toBe(401)
    // And on the replica that revoked it.
    expect((await new Api(cluster.replicas[0]?.url ?? '', key).call('GET', '/v1/sessions')).status).toBe(401)
  })

  it("a preview WebSocket relayed by one replica closes when the other revokes its port's URLs", async () => {
    const [one, two] = [cluster.api(0), cluster.api(1)]
    const project = await makeProject({ ...SHELL_PROJECT, 'upgrade_echo.py': UPGRADE_ECHO_PY })
    expect((await one.deploy(project)).status).toBe(201)
    const sessionId = (await one.createSession('shell')).id
    const started = await one.send(
      sessionId,
      `(nohup python3 upgrade_echo.py >/tmp/echo.log 2>&1 &) && for i in $(seq 100); do python3 -c "import socket; socket.create_connection(('127.0.0.1', 8001))" 2>/dev/null && break; sleep 0.05; done`,
    )
    expect(started.text).toContain('[exit 0]')
    const signed = await one.call('POST', `/v1/sessions/${sessionId}/ports/8001/url`, { ttlMs: 60_000 })
    expect(signed.status).toBe(200)
    const { url } = signed.body as { url: string }
    const upgrade = rawPreviewUpgrade(url)
    await until(() => upgrade.received().includes('saw-key'))
    expect(upgrade.received()).toMatch(/^HTTP\/1\.1 101 /)
    // Revoked through the replica that does not relay it (its URLs: any replica may revoke them).
    expect((await two.call('DELETE', `/v1/sessions/${sessionId}/ports/8001/url`)).status).toBe(200)
    await until(() => upgrade.closed())
    upgrade.socket.destroy()
    expect(upgrade.closed()).toBe(true)
  })

  it('a replica that could have missed a hint does not trust the keys it remembers', async () => {
    const created = await cluster.api(0).call('POST', '/v1/keys', { name: 'gap' })
    expect(created.status).toBe(201)
    const { id, key } = created.body as { id: string; key: string }
    const onTwo = new Api(cluster.replicas[1]?.url ?? '', key)
    expect((await onTwo.call('GET', '/v1/sessions')).status).toBe(200)
    // The listeners' connections are cut, and the key revoked in the database with no hint at all
    // (as if it had been sent while they were away): what the replica remembers is stale.
    const client = new pg.Client({ connectionString: cluster.databaseUrl })
    await client.connect()
    try {
      const cut = await client.query(
        `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'cairn-hints'`,
      )
      expect(cut.rowCount).toBeGreaterThan(0)
      await client.query('UPDATE api_keys SET revoked_at = $1 WHERE id = $2', [new Date().toISOString(), id])
    } finally {
      await client.end()
    }
    let status = 0
    await until(async () => {
      status = (await onTwo.call('GET', '/v1/sessions')).status
      return status === 401
    })
    expect(status).toBe(401)
  })
})
