import { mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { Readable } from 'node:stream'
import { Parser, type ReadEntry } from 'tar'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { projectIgnore } from './ignore-rules.js'
import { agentNameFrom, inferCommand, readLocalManifest, renderManifest } from './manifest.js'
import { packProject } from './pack.js'

let dir: string

beforeEach(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-pack-'))
})
afterEach(async () => {
  await rm(dir, { recursive: true, force: true })
})

async function put(rel: string, content = 'x') {
  await mkdir(path.dirname(path.join(dir, rel)), { recursive: true })
  await writeFile(path.join(dir, rel), content)
}

/** Lists the archive the way the server reads it: entry paths and file contents. */
async function listArchive(archive: Uint8Array): Promise<Map<string, string>> {
  const entries = new Map<string, string>()
  const parser = new Parser()
  parser.on('entry', (entry: ReadEntry) => {
    const chunks: Buffer[] = []
    entry.on('data', (c: Buffer) => chunks.push(c))
    entry.on('end', () => entries.set(entry.path, Buffer.concat(chunks).toString('utf8')))
  })
  await new Promise<void>((resolve, reject) => {
    parser.on('end', resolve)
    parser.on('error', reject)
    Readable.from([Buffer.from(archive)]).pipe(parser)
  })
  return entries
}

describe('packProject', () => {
  it('applies the default, .gitignore, .cairnignore and cairn.yaml rules', async () => {
    await put('cairn.yaml', 'name: demo\ncommand: python3 agent.py\nignore:\n  - "*.csv"\n  - data/tmp/\n')
    await put('agent.py', 'print(1)')
    await put('lib/util.py')
    await put('.git/HEAD')
    await put('node_modules/x/index.js')
    await put('sub/node_modules/y.js')
    await put('.venv/bin/python')
    await put('pkg/__pycache__/a.pyc')
    await put('.env', 'SECRET=1')
    await put('.env.local', 'SECRET=2')
    await put('.env.example', 'SECRET=')
    await put('.gitignore', 'build/\n# comment\n*.log\n')
    await put('.cairnignore', 'private.txt\n')
    await put('build/out.js')
    await put('debug.log')
    await put('private.txt')
    await put('report.csv')
    await put('data/tmp/cache.bin')
    await put('data/keep.txt')
    await mkdir(path.join(dir, 'empty'))
    await symlink('agent.py', path.join(dir, 'link.py'))
    await symlink('/etc/passwd', path.join(dir, 'passwd'))
    await symlink('../../outside', path.join(dir, 'lib/out'))
    const manifest = await readLocalManifest(dir)
    const packed = await packProject(dir, await projectIgnore(dir, manifest?.ignore))
    expect(packed.files).toEqual([
      '.cairnignore',
      '.env.example',
      '.gitignore',
      'agent.py',
      'cairn.yaml',
      'data/keep.txt',
      'lib/util.py',
      'link.py',
    ])
    const entries = await listArchive(packed.archive)
    expect([...entries.keys()].sort()).toEqual([
      '.cairnignore',
      '.env.example',
      '.gitignore',
      'agent.py',
      'cairn.yaml',
      'data/keep.txt',
      'empty/',
      'lib/util.py',
      'link.py',
    ])
    expect(packed.skipped).toEqual(['lib/out', 'passwd'])
    expect(entries.get('agent.py')).toBe('print(1)')
  })

  it('keeps cairn.yaml even when a rule would drop it', async () => {
    await put('cairn.yaml', 'name: demo\ncommand: bash run.sh\n')
    await put('.cairnignore', '*.yaml\n')
    await put('run.sh')
    const packed = await packProject(dir, await projectIgnore(dir))
    expect(packed.files).toContain('cairn.yaml')
  })

  it('adds a generated cairn.yaml at the root', async () => {
    await put('bot.py', 'print(input())')
    const yaml = renderManifest({ name: 'bot', command: ['python3', 'bot.py'], protocol: 'stdio' }, false)
    const packed = await packProject(dir, await projectIgnore(dir), { 'cairn.yaml': yaml })
    const entries = await listArchive(packed.archive)
    expect(entries.get('cairn.yaml')).toBe('name: bot\ncommand: python3 bot.py\nprotocol: stdio\n')
    expect(entries.get('bot.py')).toBe('print(input())')
    expect(packed.files).toEqual(['bot.py', 'cairn.yaml'])
  })
})

describe('manifest helpers', () => {
  it('infers the command from the extension', () => {
    expect(inferCommand('agent.py')).toEqual(['python3', 'agent.py'])
    expect(inferCommand('src/main.ts')).toEqual(['tsx', 'src/main.ts'])
    expect(inferCommand('index.js')).toEqual(['node', 'index.js'])
    expect(inferCommand('index.mjs')).toEqual(['node', 'index.mjs'])
    expect(inferCommand('run.sh')).toEqual(['bash', 'run.sh'])
    expect(inferCommand('README.md')).toBeUndefined()
  })

  it('makes valid agent names', () => {
    expect(agentNameFrom('My Agent_2')).toBe('my-agent-2')
    expect(agentNameFrom('--x--')).toBe('x')
    expect(agentNameFrom('日本')).toBe('agent')
    expect(agentNameFrom('a'.repeat(80))).toHaveLength(63)
  })

  it('renders a manifest the YAML parser reads back', async () => {
    const YAML = (await import('yaml')).default
    for (const comments of [true, false]) {
      const text = renderManifest(
        { name: '123', command: ['python3', 'my agent.py'], protocol: 'stdio' },
        comments,
      )
      expect(YAML.parse(text)).toEqual({
        name: '123',
        command: ['python3', 'my agent.py'],
        protocol: 'stdio',
      })
    }
  })
})

describe('readLocalManifest', () => {
  it('refuses a key nobody reads before anything is packed, naming the nearest known one', async () => {
    await put('cairn.yaml', 'name: a\ncommand: bash a.sh\nignroe:\n  - secrets/\n')
    await expect(readLocalManifest(dir)).rejects.toThrow(
      "unknown key 'ignroe' in cairn.yaml; did you mean 'ignore'?",
    )
    await put('cairn.yaml', 'name: a\ncommand: bash a.sh\nimage: debian:bookworm\npackages: [git]\n')
    await expect(readLocalManifest(dir)).resolves.toMatchObject({
      data: { image: 'debian:bookworm', packages: ['git'] },
    })
    // Every commented key of `cairn init`'s template is known, once uncommented.
    const template = renderManifest({ name: 'a', command: ['bash', 'a.sh'], protocol: 'stdio' }, true)
    await put(
      'cairn.yaml',
      template.replace(
        /^# ?(\s*(?:(?:ignore|secrets|limits|memoryMiB|pids|cpus|turnTimeoutMs|persist):|- ))/gm,
        '$1',
      ),
    )
    await expect(readLocalManifest(dir)).resolves.toMatchObject({
      name: 'a',
      ignore: ['data/*.csv'],
      data: {
        secrets: ['ANTHROPIC_API_KEY'],
        limits: { memoryMiB: 512, turnTimeoutMs: 600000 },
        persist: ['~/.cache/my-tool'],
      },
    })
  })
})

describe('findEntry', () => {
  it('prefers conventional names, else the only runnable file', async () => {
    const { findEntry } = await import('./manifest.js')
    expect(await findEntry(dir)).toBeUndefined()
    await put('slow.sh')
    await put('README.md')
    expect(await findEntry(dir)).toBe('slow.sh')
    await put('other.py')
    expect(await findEntry(dir)).toBeUndefined()
    await put('main.py')
    expect(await findEntry(dir)).toBe('main.py')
  })
})
