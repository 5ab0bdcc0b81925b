import { mkdtemp, rm, stat, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { extractGlobalFlags, useColor } from './argv.js'
import { resolveApiConfig } from './config.js'
import { credentialsPath, readCredentials, removeCredentials, writeCredentials } from './credentials.js'

describe('extractGlobalFlags', () => {
  it('takes --json from anywhere', () => {
    expect(extractGlobalFlags(['--json', 'sessions', 'list'])).toEqual({
      args: ['sessions', 'list'],
      flags: { json: true, color: undefined, apiUrl: undefined, apiKey: undefined },
    })
    expect(extractGlobalFlags(['sessions', 'list', '--limit', '3', '--json']).args).toEqual([
      'sessions',
      'list',
      '--limit',
      '3',
    ])
  })

  it('reads --api-url/--api-key with a space or =, and --no-color', () => {
    const { args, flags } = extractGlobalFlags([
      '--api-url=http://x',
      'run',
      '--api-key',
      'k',
      'echo',
      '--no-color',
    ])
    expect(args).toEqual(['run', 'echo'])
    expect(flags).toMatchObject({ apiUrl: 'http://x', apiKey: 'k', color: false })
  })

  it('leaves everything after -- alone', () => {
    expect(extractGlobalFlags(['run', 'echo', '--', '--json']).args).toEqual(['run', 'echo', '--', '--json'])
  })
})

describe('useColor', () => {
  it('honours --no-color, NO_COLOR, FORCE_COLOR and the terminal', () => {
    expect(useColor(false, {}, true)).toBe(false)
    expect(useColor(undefined, { NO_COLOR: '1' }, true)).toBe(false)
    expect(useColor(undefined, { NO_COLOR: '' }, true)).toBe(true)
    expect(useColor(undefined, { FORCE_COLOR: '1' }, false)).toBe(true)
    expect(useColor(undefined, {}, false)).toBe(false)
    expect(useColor(undefined, { TERM: 'dumb' }, true)).toBe(false)
  })
})

describe('API config', () => {
  const saved = { apiUrl: 'http://saved:1', apiKey: 'saved-key' }
  it('resolves flags > env > credentials > default', () => {
    expect(
      resolveApiConfig({ apiUrl: 'http://flag/' }, { CAIRN_API_URL: 'http://env' }, saved),
    ).toMatchObject({
      apiUrl: 'http://flag',
      urlSource: 'flag',
      apiKey: 'saved-key',
      keySource: 'credentials',
    })
    expect(resolveApiConfig({}, { CAIRN_API_URL: 'http://env', CAIRN_API_KEY: 'e' }, saved)).toMatchObject({
      apiUrl: 'http://env',
      apiKey: 'e',
    })
    expect(resolveApiConfig({}, {}, undefined)).toEqual({
      apiUrl: 'http://127.0.0.1:7070',
      apiKey: undefined,
      urlSource: 'default',
      keySource: 'none',
    })
  })
})

describe('credentials file', () => {
  it('is looked up in CAIRN_CONFIG_DIR, then XDG_CONFIG_HOME/cairn, then ~/.config/cairn', () => {
    expect(credentialsPath({ CAIRN_CONFIG_DIR: '/c', XDG_CONFIG_HOME: '/x' })).toBe('/c/credentials.json')
    expect(credentialsPath({ XDG_CONFIG_HOME: '/x' })).toBe('/x/cairn/credentials.json')
    expect(credentialsPath({})).toBe(path.join(os.homedir(), '.config', 'cairn', 'credentials.json'))
  })

  it('is written 0600, read back and removed', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-cred-'))
    try {
      const file = path.join(dir, 'sub', 'credentials.json')
      expect(await readCredentials(file)).toBeUndefined()
      await writeCredentials({ apiUrl: 'http://h', apiKey: 'k' }, file)
      expect((await stat(file)).mode & 0o777).toBe(0o600)
      expect(await readCredentials(file)).toEqual({ apiUrl: 'http://h', apiKey: 'k' })
      expect(await removeCredentials(file)).toBe(true)
      expect(await removeCredentials(file)).toBe(false)
      await writeFile(file, '{broken')
      await expect(readCredentials(file)).rejects.toThrow(/not valid JSON/)
    } finally {
      await rm(dir, { recursive: true, force: true })
    }
  })
})
