import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import Fastify from 'fastify'
import { afterAll, describe, expect, it } from 'vitest'
import { consoleRoutes } from '../../packages/server/src/http/console.js'

const dirs: string[] = []
afterAll(async () => {
  for (const dir of dirs) await rm(dir, { recursive: true, force: true })
})

async function appWith(dir: string) {
  const app = Fastify()
  consoleRoutes(app, dir)
  await app.ready()
  return app
}

describe('console static files', () => {
  it('answers / with a page saying how to build the console when it is not built', async () => {
    const app = await appWith(path.join(os.tmpdir(), 'cairn-no-console-here'))
    const res = await app.inject({ method: 'GET', url: '/' })
    expect(res.statusCode).toBe(200)
    expect(res.headers['content-type']).toContain('text/html')
    expect(res.body).toContain('npm run build')
    expect((await app.inject({ method: 'GET', url: '/assets/main.js' })).statusCode).toBe(404)
    await app.close()
  })

  it('serves index.html and assets with their types, and nothing outside assets/', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-console-'))
    dirs.push(dir)
    await mkdir(path.join(dir, 'assets'))
    await writeFile(path.join(dir, 'index.html'), '<!doctype html><title>x</title>')
    await writeFile(path.join(dir, 'assets/app-1.js'), 'console.log(1)')
    await writeFile(path.join(dir, 'secret.js'), 'nope')
    const app = await appWith(dir)
    const index = await app.inject({ method: 'GET', url: '/' })
    expect(index.body).toContain('<title>x</title>')
    expect(index.headers['content-security-policy']).toContain("default-src 'none'")
    const js = await app.inject({ method: 'GET', url: '/assets/app-1.js' })
    expect(js.statusCode).toBe(200)
    expect(js.headers['content-type']).toContain('text/javascript')
    expect(js.headers['cache-control']).toContain('immutable')
    for (const url of [
      '/assets/../secret.js',
      '/assets/..%2Fsecret.js',
      '/assets/%2e%2e/secret.js',
      '/assets/app-1.txt',
    ]) {
      expect((await app.inject({ method: 'GET', url })).statusCode, url).toBe(404)
    }
    await app.close()
  })
})
