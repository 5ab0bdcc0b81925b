import type { FastifyInstance, RouteOptions } from 'fastify'

interface KnownRoute {
  segments: string[]
  /** The template ends in `*`: it takes any rest of the path. */
  wildcard: boolean
  methods: Set<string>
}

/**
 * The methods each route template takes, recorded as routes are added, so a request the router
 * found no route for can be told apart: a path no route has (404) from a known path asked with
 * another method (405, with the `Allow` header listing the methods it takes).
 */
export class RouteMethods {
  private readonly routes = new Map<string, KnownRoute>()

  /** Records every route added to `app` (and its child scopes) from now on. */
  constructor(app: FastifyInstance) {
    app.addHook('onRoute', (route: RouteOptions) => this.add(route.url, route.method))
  }

  private add(url: string, method: RouteOptions['method']): void {
    const wildcard = url.endsWith('*')
    const template = wildcard ? url.slice(0, -1) : url
    let known = this.routes.get(url)
    if (!known) {
      known = { segments: template.split('/'), wildcard, methods: new Set() }
      this.routes.set(url, known)
    }
    for (const m of Array.isArray(method) ? method : [method]) known.methods.add(String(m).toUpperCase())
    // Fastify answers HEAD wherever it answers GET.
    if (known.methods.has('GET')) known.methods.add('HEAD')
  }

  /** The methods some route takes at `pathname` (sorted), or none: no route has that path. */
  allowed(pathname: string): string[] {
    const parts = pathname.split('/').map(decodeSegment)
    const methods = new Set<string>()
    for (const route of this.routes.values())
      if (matches(route, parts)) for (const m of route.methods) methods.add(m)
    return [...methods].sort()
  }
}

function matches(route: KnownRoute, parts: string[]): boolean {
  const { segments, wildcard } = route
  // A wildcard template's last segment is the empty text before its `*`.
  const fixed = wildcard ? segments.length - 1 : segments.length
  if (wildcard ? parts.length <= fixed : parts.length !== fixed) return false
  for (let i = 0; i < fixed; i++) {
    const segment = segments[i] as string
    if (!segment.startsWith(':') && segment !== parts[i]) return false
  }
  return true
}

function decodeSegment(segment: string): string {
  try {
    return decodeURIComponent(segment)
  } catch {
    return segment
  }
}
