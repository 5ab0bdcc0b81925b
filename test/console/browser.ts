import { mkdir, mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { type BrowserContext, chromium, type Page } from 'playwright-core'
import { REPO_ROOT } from '../helpers/server.js'

export const CHROMIUM = process.env.CAIRN_CHROMIUM ?? '/usr/bin/chromium'
/**
 * Where the console's screenshots go: docs/screenshots when asked for (CAIRN_UPDATE_SCREENSHOTS=1,
 * to refresh the docs' pictures), else test-results/screenshots, so a test run leaves the tree as
 * it found it (each run's pixels differ a little).
 */
export const SCREENSHOTS = path.join(
  REPO_ROOT,
  process.env.CAIRN_UPDATE_SCREENSHOTS === '1' ? 'docs/screenshots' : 'test-results/screenshots',
)

// Headless Debian chromium with nothing that talks to the network on its own.
const ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
]

export interface Browser {
  context: BrowserContext
  page: Page
  /** Requests the pages made to anything but the server under test. */
  foreignRequests: string[]
  /** Every URL requested (to check that no API key ever appears in one). */
  urls: string[]
  close(): Promise<void>
}

/** Chromium with a fresh profile (--user-data-dir) that records any request leaving `origin`. */
export async function launchBrowser(origin: string): Promise<Browser> {
  const profile = await mkdtemp(path.join(os.tmpdir(), 'cairn-chromium-'))
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: ARGS,
    viewport: { width: 1280, height: 860 },
    colorScheme: 'light',
    reducedMotion: 'reduce',
  })
  const foreignRequests: string[] = []
  const urls: string[] = []
  context.on('request', (request) => {
    const url = request.url()
    urls.push(url)
    if (!url.startsWith(origin) && !url.startsWith('blob:') && !url.startsWith('data:'))
      foreignRequests.push(url)
  })
  const page = context.pages()[0] ?? (await context.newPage())
  return {
    context,
    page,
    foreignRequests,
    urls,
    async close() {
      await context.close()
      await rm(profile, { recursive: true, force: true })
    },
  }
}

/** Saves a screenshot of the page to SCREENSHOTS/NAME.png. */
export async function screenshot(page: Page, name: string, fullPage = false): Promise<void> {
  await mkdir(SCREENSHOTS, { recursive: true })
  await page.screenshot({ path: path.join(SCREENSHOTS, `${name}.png`), fullPage, animations: 'disabled' })
}
