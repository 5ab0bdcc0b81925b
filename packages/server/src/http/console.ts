import { existsSync } from 'node:fs'
import { readFile } from 'node:fs/promises'
import { createRequire } from 'node:module'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { Type } from '@sinclair/typebox'
import type { FastifyInstance, FastifyReply } from 'fastify'

const TYPES: Record<string, string> = {
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.html': 'text/html; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.woff2': 'font/woff2',
  '.map': 'application/json; charset=utf-8',
}

// The console talks only to this origin; blob: URLs show images and downloads from the workspace.
const CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' blob: data:",
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join('; ')

const AssetParams = Type.Object({ '*': Type.String() })

const MISSING = `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Cairn</title></head>
<body><h1>Cairn</h1><p>The web console is not built. Run <code>npm run build</code> in the Cairn
repository, then reload this page. The API is at <code>/v1</code>.</p></body></html>`

/** Where the built console is: `CAIRN_CONSOLE_DIR`, the installed `@cairn/console`, or the monorepo. */
export function findConsoleDir(): string {
  const fromEnv = process.env.CAIRN_CONSOLE_DIR
  if (fromEnv) return fromEnv
  try {
    const pkg = createRequire(import.meta.url).resolve('@cairn/console/package.json')
    return path.join(path.dirname(pkg), 'dist')
  } catch {
    // Not installed as a package: the monorepo layout (packages/server/{src,dist}/http -> packages/console).
    return fileURLToPath(new URL('../../../console/dist', import.meta.url))
  }
}

const secure = (reply: FastifyReply) =>
  reply
    .header('content-security-policy', CSP)
    .header('x-content-type-options', 'nosniff')
    .header('referrer-policy', 'no-referrer')

/** Serves the web console: `/` (index.html) and `/assets/*` (hashed, cached for a year). */
export function consoleRoutes(server: FastifyInstance, dir = findConsoleDir()): void {
  const app = server.withTypeProvider<TypeBoxTypeProvider>()
  const root = path.resolve(dir)
  const assets = path.join(root, 'assets')
  const index = async (_request: unknown, reply: FastifyReply) => {
    const file = path.join(root, 'index.html')
    const html = existsSync(file) ? await readFile(file) : MISSING
    return secure(reply).header('cache-control', 'no-cache').type('text/html; charset=utf-8').send(html)
  }
  app.get('/', { schema: { hide: true } }, index)
  app.get('/index.html', { schema: { hide: true } }, index)
  app.get('/assets/*', { schema: { hide: true, params: AssetParams } }, async (request, reply) => {
    const name = request.params['*']
    const file = path.resolve(assets, name)
    const type = TYPES[path.extname(file)]
    if (!type || path.dirname(file) !== assets || !existsSync(file)) {
      return reply.status(404).type('text/plain; charset=utf-8').send('not found')
    }
    return secure(reply)
      .header('cache-control', 'public, max-age=31536000, immutable')
      .type(type)
      .send(await readFile(file))
  })
}
