import { existsSync } from 'node:fs'
import { readFile } from 'node:fs/promises'
import type { Page, WebSocket } from 'playwright-core'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
// @ts-expect-error: a plain ESM build script without type declarations
import { buildConsole } from '../../packages/console/build.mjs'
import { makeProject, REVIEWER_PROJECT } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'
import { SHELL_AGENT } from './agent.js'
import { type Browser, CHROMIUM, launchBrowser, screenshot } from './browser.js'

let t: TestServer
let browser: Browser
let page: Page

const tab = (name: string) => page.locator(`nav.tabs a[data-tab="${name}"]`).click()
const turn = (n: number) => page.locator(`#transcript li.turn[data-turn="${n}"]`)
const confirm = (label: string) => page.locator('dialog.confirm').getByRole('button', { name: label }).click()

/** Sends a message with the keyboard and waits for the turn to finish. */
async function send(n: number, message: string): Promise<void> {
  await page.locator('#message').fill(message)
  await page.locator('#message').press('Enter')
  await expect
    .poll(() => turn(n).locator('.msg.agent .meta').textContent(), { timeout: 30_000 })
    .toMatch(/completed/)
}

async function openFile(path: string): Promise<void> {
  await page.locator(`#file-tree button.file[data-path="/workspace/${path}"]`).click()
  await page.locator('#file-viewer .viewer-head').getByText(`/workspace/${path}`).waitFor()
}

describe.skipIf(!existsSync(CHROMIUM))('web console in chromium', () => {
  beforeAll(async () => {
    await buildConsole()
    t = await startTestServer()
    expect((await t.api.deploy(await makeProject(SHELL_AGENT))).status).toBe(201)
    browser = await launchBrowser(t.url)
    page = browser.page
  })

  afterAll(async () => {
    await browser?.close()
    await t?.close()
  })

  it('serves the console at / with a strict CSP, and its hashed assets', async () => {
    const res = await fetch(`${t.url}/`)
    expect(res.status).toBe(200)
    expect(res.headers.get('content-security-policy')).toContain("connect-src 'self'")
    const html = await res.text()
    const asset = /src="(\/assets\/[^"]+\.js)"/.exec(html)?.[1]
    expect(asset).toBeDefined()
    const js = await fetch(`${t.url}${asset}`)
    expect(js.headers.get('content-type')).toContain('javascript')
    expect((await fetch(`${t.url}/assets/..%2F..%2Fpackage.json`)).status).toBe(404)
  })

  it('rejects a wrong key with an error and shows no data', async () => {
    await page.goto(`${t.url}/`)
    await page.locator('#api-key').fill('cairn_wrong_key')
    await page.locator('#api-key').press('Enter')
    await expect.poll(() => page.locator('.signin .alert').textContent()).toContain('rejected this API key')
    await screenshot(page, 'signin')
    expect(await page.locator('nav[aria-label="Main"]').count()).toBe(0)
    expect(await page.evaluate(() => sessionStorage.length)).toBe(0)
  })

  it('signs in, sets a secret without ever showing it, and starts a session from the agent page', async () => {
    await page.locator('#api-key').fill(t.key)
    await page.getByRole('button', { name: 'Sign in' }).click()
    await page.getByRole('heading', { name: 'Sessions' }).waitFor()
    await page.getByRole('link', { name: 'Agents', exact: true }).click()
    await page.getByRole('link', { name: 'console-demo' }).click()
    await page.locator('#secrets-missing').getByText('DEMO_TOKEN').waitFor()
    await page.locator('#revisions-table button[data-revision]').first().click()
    await expect.poll(() => page.locator('#build-log').textContent()).not.toBe('')
    await page.locator('#secret-name').fill('DEMO_TOKEN')
    await page.locator('#secret-value').fill('s3cret-value-never-shown')
    await page.locator('#secret-save').click()
    await page.locator('#secrets-table').getByText('DEMO_TOKEN').waitFor()
    expect(await page.locator('#secrets-missing').isHidden()).toBe(true)
    expect(await page.content()).not.toContain('s3cret-value-never-shown')
    await screenshot(page, 'agent', true)
    await page.locator('#new-session-title').fill('Console demo')
    await page.locator('#new-session').click()
    await page.getByRole('heading', { name: 'Console demo' }).waitFor()
  })

  it('streams two turns: text, tool calls with durations and status lines', async () => {
    await send(1, "echo 'hello from cairn' > notes.txt && python3 make_logo.py logo.png && ls")
    await expect.poll(() => turn(1).locator('.msg.agent .text').textContent()).toContain('notes.txt')
    expect(await turn(1).locator('details.tool .tool-name').textContent()).toBe('bash')
    expect(await turn(1).locator('.tool-state').textContent()).toMatch(/✓ \d+(\.\d)? m?s/)
    expect(await turn(1).locator('.status-line').textContent()).toContain('running a shell command')

    await page
      .locator('#message')
      .fill(
        `printf 'def greet(name):\\n    # say hi\\n    return "hi " + name\\n' > hello.py && for i in 1 2 3 4 5; do echo line $i; done`,
      )
    await page.locator('#message').press('Enter')
    // Mid-stream: the first lines are on screen before the turn is over.
    await page.waitForFunction(() => {
      const live = document.querySelector('#transcript li.turn.live')?.textContent ?? ''
      return live.includes('line 1') && !live.includes('[exit')
    })
    await expect
      .poll(() => turn(2).locator('.msg.agent .meta').textContent(), { timeout: 30_000 })
      .toMatch(/completed/)
    expect(await turn(2).locator('.msg.agent .text').textContent()).toContain('line 5\n[exit 0]')
    await page.setViewportSize({ width: 1280, height: 1180 })
    await page.evaluate(() => window.scrollTo(0, 0))
    await screenshot(page, 'session-transcript')
    await page.setViewportSize({ width: 1280, height: 860 })
  })

  it('opens files the agent wrote: highlighted text and an image', async () => {
    await tab('files')
    await openFile('hello.py')
    await page.locator('#file-viewer pre .tok-keyword').getByText('def').waitFor()
    expect(await page.locator('#file-viewer pre .tok-comment').textContent()).toBe('# say hi')
    await openFile('logo.png')
    await page.waitForFunction(
      () => (document.querySelector('#file-viewer img') as HTMLImageElement | null)?.naturalWidth === 96,
    )
    await screenshot(page, 'session-image')
    await openFile('hello.py')
    await page.locator('#file-viewer pre .tok-keyword').first().waitFor()
    await screenshot(page, 'session-files')
    const [download] = await Promise.all([
      page.waitForEvent('download'),
      page.locator('#file-download').click(),
    ])
    expect(download.suggestedFilename()).toBe('hello.py')
    expect(await readFile((await download.path()) as string, 'utf8')).toContain('def greet(name):')
  })

  it('snapshots, lets the agent delete a file, restores it, and forks', async () => {
    await tab('snapshots')
    await page.locator('#snapshot-label').fill('before delete')
    await page.locator('#snapshot-take').click()
    const snap = page.locator('#snapshot-list li', { hasText: 'before delete' })
    await snap.waitFor()

    await tab('transcript')
    await send(3, 'rm notes.txt && ls')
    await tab('files')
    await page.locator('#file-tree button.file[data-path="/workspace/hello.py"]').waitFor()
    await expect
      .poll(() => page.locator('#file-tree button.file[data-path="/workspace/notes.txt"]').count())
      .toBe(0)

    await tab('snapshots')
    await snap.locator('button[data-action="restore"]').click()
    await confirm('Restore')
    await page.locator('.notice').getByText('Workspace restored').waitFor()
    // Each entry says which turn's files it holds and why it was taken, in words.
    const auto = page
      .locator('#snapshot-list li', { hasText: 'After turn 2' })
      .filter({ has: page.locator('.kind-auto') })
    expect(await auto.locator('.reason').textContent()).toBe('what turn 3 starts from')
    expect(await page.locator('#snapshot-list li').first().textContent()).toContain('After turn 3')
    await screenshot(page, 'session-snapshots')
    await tab('files')
    await openFile('notes.txt')
    await page.locator('#file-viewer pre').getByText('hello from cairn').waitFor()

    await tab('events')
    await page.locator('#event-log').getByText('workspace_restored').waitFor()
    await screenshot(page, 'session-events')
    await tab('manifest')
    // The manifest reads as fields, not JSON (which is one click away).
    const field = (term: string) =>
      page.locator('#manifest dt', { hasText: term }).locator('xpath=following-sibling::dd[1]')
    await field('Agent').getByText('console-demo').waitFor()
    expect(await field('Generation').textContent()).toMatch(/^\d+$/)
    expect(await page.locator('#manifest').textContent()).not.toContain('"revision"')
    await screenshot(page, 'session-manifest', true)

    const parent = page.url()
    await tab('snapshots')
    await snap.locator('button[data-action="fork"]').click()
    await page.getByRole('heading', { name: /fork at turn 2/ }).waitFor()
    expect(page.url()).not.toBe(parent)
    await turn(2).waitFor()
    expect(await page.locator('#transcript li.turn').count()).toBe(2)
    await tab('files')
    await page.locator('#file-tree button.file[data-path="/workspace/notes.txt"]').waitFor()
    await page.goto(parent)
    await page.getByRole('heading', { name: 'Console demo' }).waitFor()
  })

  it('opens a shell in the terminal tab: typed input runs, output renders, resizes reach it', async () => {
    const sockets: WebSocket[] = []
    page.on('websocket', (ws) => sockets.push(ws))
    const screen = page.locator('#terminal-screen .xterm-rows')
    /** Types a line into the terminal and waits for what it prints. */
    const run = async (line: string, output: RegExp) => {
      await page.locator('#terminal-screen').click()
      await page.keyboard.type(line)
      await page.keyboard.press('Enter')
      await expect.poll(() => screen.textContent(), { timeout: 20_000 }).toMatch(output)
    }
    await tab('terminal')
    // Typed before the socket is open: kept and sent once it is.
    await page.locator('#terminal-screen').click()
    await page.keyboard.type('echo "sum $((40 + 2))" in "$PWD"')
    await page.keyboard.press('Enter')
    await expect.poll(() => screen.textContent(), { timeout: 20_000 }).toContain('sum 42 in /workspace')
    await page.locator('#terminal-status').getByText('in /workspace').waitFor()
    const cols = async (name: string) => {
      await run(`echo ${name}=$(tput cols)`, new RegExp(`${name}=\\d+`))
      return Number(new RegExp(`${name}=(\\d+)`).exec((await screen.textContent()) ?? '')?.[1])
    }
    const wide = await cols('wide')
    await page.setViewportSize({ width: 900, height: 860 })
    const narrow = await cols('narrow')
    expect(narrow).toBeGreaterThan(20)
    expect(narrow).toBeLessThan(wide)
    await page.setViewportSize({ width: 1280, height: 860 })
    await run('printf "\\033[1;32mgreen\\033[0m\\n"', /green/)
    // xterm's colours reach the page under its CSP (no inline style): green is not the default white.
    const green = screen.getByText('green', { exact: true })
    expect(await green.evaluate((el) => getComputedStyle(el).color)).not.toBe('rgb(255, 255, 255)')
    await screenshot(page, 'session-terminal')
    // Leaving the tab closes the socket; coming back reattaches to the same shell.
    await tab('events')
    await expect.poll(() => sockets.map((ws) => ws.isClosed())).toEqual([true])
    await tab('terminal')
    await expect.poll(() => sockets.length).toBe(2)
    await run('echo back=$((6 * 7))', /back=42/)
    await run('exit 5', /exit/)
    await page.locator('#terminal-status').getByText('exited (exit 5)').waitFor()
    await expect.poll(() => sockets.every((ws) => ws.isClosed())).toBe(true)
  })

  it('ends the session after a confirmation', async () => {
    await page.locator('#session-end').click()
    await confirm('End session')
    await page.locator('dl.meta .badge').getByText('completed').waitFor()
    const id = decodeURIComponent(page.url().split('#/sessions/')[1] ?? '').split('/')[0] ?? ''
    expect((await t.api.call('GET', `/v1/sessions/${id}`)).body.status).toBe('completed')
  })

  it('shows an API error with its message', async () => {
    await page.goto(`${t.url}/#/sessions/ses_doesnotexist`)
    await expect.poll(() => page.locator('.alert').textContent()).toMatch(/session_not_found|not found/i)
    expect(await page.locator('nav.tabs').isHidden()).toBe(true)
  })

  it('lists sessions with filters and live statuses, and counts usage', async () => {
    await page.getByRole('link', { name: 'Sessions', exact: true }).click()
    await expect.poll(() => page.locator('#sessions-table tbody tr[data-session]').count()).toBe(2)
    await page.locator('#filter-status').selectOption('completed')
    await expect.poll(() => page.locator('#sessions-table tbody tr[data-session]').count()).toBe(1)
    await page.locator('#filter-status').selectOption('')
    await page.locator('#filter-search').fill('fork')
    await expect.poll(() => page.locator('#sessions-table tbody tr[data-session]').count()).toBe(1)
    await page.locator('#filter-search').fill('')
    await expect.poll(() => page.locator('#sessions-table tbody tr[data-session]').count()).toBe(2)
    await screenshot(page, 'sessions')

    await page.getByRole('link', { name: 'Usage', exact: true }).click()
    await expect.poll(() => page.locator('#usage-stats .stat').first().textContent()).toBe('2sessions')
    await expect.poll(() => page.locator('#usage-sessions tbody tr').count()).toBe(2)
    // Storage and retention come from GET /v1/usage?storage=true, per session and per layer.
    expect(await page.locator('main').textContent()).not.toContain('not reported by the API')
    const size = /^\d+(\.\d)? (B|KiB|MiB|GiB)$/
    const exclusive = page.locator('#usage-sessions td[data-label="Exclusive"]')
    expect(await exclusive.allTextContents()).toEqual([
      expect.stringMatching(size),
      expect.stringMatching(size),
    ])
    const layers = page.locator('#usage-retention td[data-label="Layer"]')
    expect(await layers.allTextContents()).toEqual(
      expect.arrayContaining(['Snapshots', 'Workspaces of ended sessions', 'In all']),
    )
    await screenshot(page, 'usage', true)
  })

  it('is readable at 360 px wide', async () => {
    await page.setViewportSize({ width: 360, height: 780 })
    await page.getByRole('link', { name: 'Sessions', exact: true }).click()
    await page.locator('#sessions-table tbody tr[data-session]').first().waitFor()
    await screenshot(page, 'mobile-sessions')
    await page.locator('#sessions-table').getByRole('link', { name: 'Console demo', exact: true }).click()
    await turn(3).waitFor()
    expect(await page.evaluate(() => document.documentElement.scrollWidth)).toBeLessThanOrEqual(360)
    await screenshot(page, 'mobile-session')
    await page.setViewportSize({ width: 1280, height: 860 })
  })

  it('works with the keyboard alone, and the key never leaves the tab', async () => {
    const other = await browser.context.newPage()
    await other.goto(`${t.url}/`)
    await other.keyboard.type(t.key)
    await other.keyboard.press('Enter')
    await other.getByRole('heading', { name: 'Sessions' }).waitFor()
    let focused = ''
    for (let i = 0; i < 12 && focused !== 'Agents'; i++) {
      await other.keyboard.press('Tab')
      focused = await other.evaluate(() => document.activeElement?.textContent ?? '')
    }
    expect(focused).toBe('Agents')
    await other.keyboard.press('Enter')
    await other.getByRole('heading', { name: 'Agents' }).waitFor()
    await other.close()
    expect(browser.urls.filter((u) => u.includes(t.key))).toEqual([])
    expect(browser.foreignRequests).toEqual([])
  })

  it("shows the request the session's agent waits on, and approves it with a note", async () => {
    expect((await t.api.deploy(await makeProject(REVIEWER_PROJECT))).status).toBe(201)
    const { id } = await t.api.createSession('reviewed')
    expect((await t.api.send(id, 'ask from the console test')).terminal?.type).toBe('run.completed')
    await page.goto(`${t.url}/#/sessions/${id}`)
    await page.locator('#approval').getByText('delete build/').waitFor()
    await page.locator('#approval-note').fill('from the console')
    await page.locator('#approval-approve').click()
    await expect
      .poll(() => turn(2).locator('.msg.agent').textContent(), { timeout: 30_000 })
      .toMatch(/got apr_\w+ approve from the console/)
    await expect.poll(() => page.locator('#approval').isHidden()).toBe(true)
    const [request] = (await t.api.call('GET', `/v1/sessions/${id}/approvals`)).body.data
    expect(request).toMatchObject({ status: 'approved', note: 'from the console' })
  })
})
