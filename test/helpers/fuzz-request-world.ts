import { appendFile, cp, mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { expect } from 'vitest'
import { ids, keys, links, WEBHOOK } from './fuzz-request-ops.js'
import { makeProject, REVIEWER_PROJECT } from './projects.js'
import { type Api, EXAMPLES, packDir } from './server.js'

/**
 * What test/security/fuzz-requests.test.ts's server holds before the run, so every operation has
 * real IDs to reach a success with (`ids`): agents (one with a resume phase, victims for the
 * deletes), a live session that ran its setup and resume phases with a snapshot, a fork, commands
 * (one reading stdin, one ended, a service on port 8000), ended, deleted and spare sessions,
 * webhooks, a key to delete, a read-only key (`keys.read`), a secret, an artifact and a pending
 * approval. Each is protected from the linked IDs' deletes.
 */
export async function buildWorld(api: Api): Promise<void> {
  // The echo example with a resume phase, so its routes answer too (see the live session below).
  const echoDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-fuzz-echo-'))
  await cp(`${EXAMPLES}/echo`, echoDir, { recursive: true })
  await appendFile(path.join(echoDir, 'cairn.yaml'), 'session:\n  resume: echo resumed\n')
  const archive = await packDir(echoDir)
  await rm(echoDir, { recursive: true, force: true })
  const deployed = await api.call('POST', '/v1/agents', archive)
  expect(deployed.status).toBe(201)
  ids.agent = deployed.body.agent.id
  ids.revision = deployed.body.revision.id
  const victim = await api.call('POST', '/v1/agents?name=victim', archive)
  expect(victim.status).toBe(201)
  ids.victimAgent = victim.body.agent.id
  const compatVictim = await api.call('POST', '/v1/agents?name=compat-victim', archive)
  expect(compatVictim.status).toBe(201)
  ids.compatVictimAgent = compatVictim.body.agent.id
  // With a setup phase, so its setup routes answer too.
  ids.liveSession = (await api.createSession('echo', { setup: { command: 'echo set up' } })).id
  expect((await api.send(ids.liveSession, 'warm up')).text).toBe('warm up\n')
  // Ended and messaged again: a cold start on its workspace runs the resume phase.
  expect((await api.call('POST', `/v1/sessions/${ids.liveSession}/end`)).status).toBe(200)
  expect((await api.send(ids.liveSession, 'resumed')).text).toBe('resumed\n')
  expect((await api.call('GET', `/v1/sessions/${ids.liveSession}/resume-phase`)).body).toMatchObject({
    status: 'succeeded',
  })
  ids.turn = (await api.call('GET', `/v1/sessions/${ids.liveSession}/turns`)).body.data[0].id
  ids.snapshot = (await api.call('POST', `/v1/sessions/${ids.liveSession}/snapshots`, {})).body.id
  // A command reading its stdin until the well-formed stdin write closes it (see `wellFormedJson`),
  // so every output stream of it ends once the well-formed requests are done; the well-formed read
  // of output is of one that has ended. The run's own starts make more (ending within 3 s).
  const command = await api.call('POST', `/v1/sessions/${ids.liveSession}/commands`, {
    command: ['cat'],
    stdin: true,
  })
  expect(command.status, JSON.stringify(command.body)).toBe(201)
  ids.command = command.body.id
  // A command on a terminal, the one a resize is for (it ends with the server).
  const terminal = await api.call('POST', `/v1/sessions/${ids.liveSession}/commands`, {
    command: ['cat'],
    tty: { rows: 24, cols: 80 },
  })
  expect(terminal.status, JSON.stringify(terminal.body)).toBe(201)
  ids.terminalCommand = terminal.body.id
  // A service on port 8000, so a signed URL for it is issued while the sandbox runs (one for a
  // port nothing listens on is refused then).
  const service = await api.call('POST', `/v1/sessions/${ids.liveSession}/commands`, {
    command: ['python3', '-m', 'http.server', '8000', '--bind', '127.0.0.1'],
  })
  expect(service.status, JSON.stringify(service.body)).toBe(201)
  for (let i = 0; i < 100; i++) {
    const manifest = await api.call('GET', `/v1/sessions/${ids.liveSession}/manifest`)
    if ((manifest.body.openPorts as number[]).includes(8000)) break
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  const ended = await api.call('POST', `/v1/sessions/${ids.liveSession}/commands`, {
    command: ['echo', 'ended'],
  })
  ids.endedCommand = ended.body.id
  for (let i = 0; i < 100; i++) {
    const got = await api.call('GET', `/v1/sessions/${ids.liveSession}/commands/${ids.endedCommand}`)
    if (got.body.status === 'exited') break
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  const forked = await api.call('POST', `/v1/sessions/${ids.liveSession}/fork`, { snapshotId: ids.snapshot })
  expect(forked.status, JSON.stringify(forked.body)).toBe(201)
  ids.fork = forked.body.id
  ids.endedSession = (await api.createSession('echo')).id
  expect((await api.call('POST', `/v1/sessions/${ids.endedSession}/end`)).status).toBe(200)
  ids.deletedSession = (await api.createSession('echo')).id
  expect((await api.call('DELETE', `/v1/sessions/${ids.deletedSession}`)).status).toBe(200)
  for (let i = 0; i < 3; i++) ids.spareSessions.push((await api.createSession('echo')).id)
  ids.victimKey = (await api.call('POST', '/v1/keys', { name: 'victim' })).body.id
  for (const which of ['webhook', 'victimWebhook'] as const) {
    const hook = await api.call('POST', '/v1/webhooks', WEBHOOK)
    expect(hook.status, JSON.stringify(hook.body)).toBe(201)
    ids[which] = hook.body.id
  }
  keys.read = (await api.call('POST', '/v1/keys', { name: 'reader', role: 'read' })).body.key
  expect((await api.call('PUT', `/v1/agents/${ids.agent}/secrets`, { secrets: { K1: 'v' } })).status).toBe(
    200,
  )
  const artifact = await api.call('POST', `/v1/sessions/${ids.liveSession}/artifacts`, { path: 'echo.sh' })
  expect(artifact.status, JSON.stringify(artifact.body)).toBe(201)
  ids.artifact = artifact.body.id
  const reviewer = await api.call('POST', '/v1/agents', await packDir(await makeProject(REVIEWER_PROJECT)))
  expect(reviewer.status, JSON.stringify(reviewer.body)).toBe(201)
  ids.approvalSession = (await api.createSession('reviewed')).id
  const asked = await api.send(ids.approvalSession, 'ask fuzz')
  const requested = asked.events.find((e) => e.type === 'approval.requested')
  ids.approval = requested?.type === 'approval.requested' ? requested.approvalId : ''
  expect(ids.approval).toMatch(/^apr_/)
  links.protect(...Object.values(ids).flat())
}
