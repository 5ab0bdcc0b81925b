import { existsSync } from 'node:fs'
import type { Page } from 'playwright-core'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
// @ts-expect-error: a plain ESM build script without type declarations
import { buildConsole } from '../../packages/console/build.mjs'
import { probeGvisor } from '../../packages/runtime/src/sandbox/gvisor-driver.js'
import { makeProject } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'
import { type Browser, CHROMIUM, launchBrowser, screenshot } from './browser.js'

/**
 * The session page's fork dialog: a count, and "with memory" only where the session's driver
 * checkpoints memory (`GET /v1/runtime`); a refusal shows the API's typed error in the dialog.
 * The agent keeps a counter in its own memory only, so a fork that answers `count=N+1` went on
 * from its parent's memory. One server and one browser for the file.
 */
const COUNTER = 'count = 0\nwhile True:\n    input()\n    count += 1\n    print(f"count={count}")\n'

const gvisor = await probeGvisor()
if (!gvisor.ok) console.warn(`console fork: gVisor cannot run here, its cases are SKIPPED: ${gvisor.reason}`)

let t: TestServer
let browser: Browser
let page: Page

async function count(sessionId: string): Promise<string> {
  const run = await t.api.send(sessionId, 'tick')
  expect(run.terminal?.type, JSON.stringify(run.events)).toBe('run.completed')
  return run.text.trim()
}

/** Opens the session's page and its fork dialog. */
async function openDialog(sessionId: string): Promise<void> {
  await page.goto(`${t.url}/#/sessions/${sessionId}`)
  await page.locator('#session-fork').click()
  await page.locator('dialog.fork').waitFor()
}

describe.skipIf(!existsSync(CHROMIUM))('the console fork dialog', () => {
  beforeAll(async () => {
    await buildConsole()
    t = await startTestServer()
    for (const [name, extra] of [
      ['console-counter-bwrap', 'isolation: bwrap\n'],
      ...(gvisor.ok ? [['console-counter', 'isolation: gvisor\npause: memory\n'] as const] : []),
    ] as const) {
      const project = await makeProject({
        'cairn.yaml': `name: ${name}\ncommand: python3 -u agent.py\n${extra}`,
        'agent.py': COUNTER,
      })
      expect((await t.api.deploy(project)).status).toBe(201)
    }
    browser = await launchBrowser(t.url)
    page = browser.page
    await page.goto(`${t.url}/`)
    await page.locator('#api-key').fill(t.key)
    await page.getByRole('button', { name: 'Sign in' }).click()
    await page.getByRole('heading', { name: 'Sessions' }).waitFor()
  })

  afterAll(async () => {
    await browser?.close()
    await t?.close()
  })

  it('offers no memory under bwrap, and makes the count of plain forks asked for', async () => {
    const { id } = await t.api.createSession('console-counter-bwrap', { title: 'plain parent' })
    await openDialog(id)
    expect(await page.locator('#fork-memory').count()).toBe(0)
    await page.locator('#fork-count').fill('2')
    await page.locator('#fork-submit').click()
    await page.getByRole('heading', { name: 'Sessions' }).waitFor()
    const notice = (await page.locator('.notice').textContent()) ?? ''
    expect(notice).not.toContain('memory')
    const forks = [...notice.matchAll(/ses_[0-9a-z]+/g)].map((m) => m[0]).filter((s) => s !== id)
    expect(forks).toHaveLength(2)
    for (const fork of forks) {
      const manifest = await t.api.call('GET', `/v1/sessions/${fork}/manifest`)
      expect(manifest.body).toMatchObject({ session: { title: 'plain parent (fork)' }, parentSessionId: id })
    }
  })

  describe.skipIf(!gvisor.ok)('under gVisor', () => {
    it('forks a warm session with its memory: each fork counts on from the parent', async () => {
      const { id } = await t.api.createSession('console-counter', { keepWarmMs: 600_000 })
      expect(await count(id)).toBe('count=1')
      expect(await count(id)).toBe('count=2')
      await openDialog(id)
      await page.locator('#fork-memory').check()
      await page.locator('#fork-count').fill('2')
      await page.locator('#fork-title').fill('memory twin')
      await screenshot(page, 'session-fork')
      await page.locator('#fork-submit').click()
      await page.getByRole('heading', { name: 'Sessions' }).waitFor()
      const notice = (await page.locator('.notice').textContent()) ?? ''
      expect(notice).toContain('with its memory')
      const forks = [...notice.matchAll(/ses_[0-9a-z]+/g)].map((m) => m[0]).filter((s) => s !== id)
      expect(forks).toHaveLength(2)
      for (const fork of forks) expect(await count(fork)).toBe('count=3')
      expect(await count(id)).toBe('count=3')
    })

    it("shows the API's typed error in the dialog when the fork is refused, and makes nothing", async () => {
      // A warm sandbox of a `pause: stop` session was not started to be checkpointed.
      const { id } = await t.api.createSession('console-counter', { keepWarmMs: 600_000, pause: 'stop' })
      expect(await count(id)).toBe('count=1')
      const before = (await t.api.call('GET', '/v1/sessions?limit=100')).body.data.length
      await openDialog(id)
      await page.locator('#fork-memory').check()
      await page.locator('#fork-submit').click()
      await expect.poll(() => page.locator('#fork-error').textContent()).toContain('(bad_request, HTTP 400)')
      expect(await page.locator('dialog.fork').isVisible()).toBe(true)
      await page.locator('dialog.fork').getByRole('button', { name: 'Cancel' }).click()
      // The dialog is removed on the click's handling, after click() resolves: wait for it (up to 5 s).
      await page.locator('dialog.fork').waitFor({ state: 'detached', timeout: 5_000 })
      expect((await t.api.call('GET', '/v1/sessions?limit=100')).body.data.length).toBe(before)
      expect(await count(id)).toBe('count=2')
    })
  })
})
