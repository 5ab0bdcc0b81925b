import { spawn } from 'node:child_process'
import { readlinkSync } from 'node:fs'
import { cp, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { ImageStore, OverlayMounter } from '../packages/runtime/dist/index.js'
import { floor } from './baselines.js'
import { type Bench, progress, repeat, timedResult, waitFor } from './lib/bench.js'
import type { Target } from './lib/results.js'
import { type BenchServer, EXAMPLES, startBenchServer } from './lib/server.js'
import { type Row, row } from './lib/stats.js'

const RUNS = 40
const WARMUP = 3
const RECIPE = 'image: debian:bookworm\n'

/** examples/echo with `image:` added (a Debian minbase image, no extra packages). */
async function echoWithImage(name: string): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-bench-image-'))
  await cp(path.join(EXAMPLES, 'echo'), dir, { recursive: true })
  const yaml = (await readFile(path.join(dir, 'cairn.yaml'), 'utf8')).replace(
    /^name: echo$/m,
    `name: ${name}`,
  )
  await writeFile(path.join(dir, 'cairn.yaml'), `${yaml}${RECIPE}`)
  return dir
}

async function waitReady(server: BenchServer, agent: string): Promise<void> {
  for (let i = 0; i < 1200; i++) {
    const res = await server.http.json('GET', `/v1/agents/${agent}`)
    const status = res.body.revisions?.[0]?.status
    if (status === 'READY') return
    if (status === 'FAILED') throw new Error(`${agent}: ${res.body.revisions[0].error}`)
    await new Promise((r) => setTimeout(r, 250))
  }
  throw new Error(`${agent} still DEPLOYING`)
}

/**
 * Agent images: the first build of a Debian image (deploy to READY), a second revision with the
 * same recipe (deploy answer, READY at once), disk per image, and a cold start on an image (its
 * overlay mounted and unmounted per sandbox) beside the same agent on the host's /usr.
 */
export const images: Bench = {
  name: 'images',
  description: 'image build (first, cached), disk per image, cold start on an image vs the host root',
  run: () =>
    timedResult('images', async () => {
      const sandboxFloor = await floor('bwrap bash -c :')
      const server = await startBenchServer({ server: { defaultImage: 'host' } })
      const dirs: string[] = []
      try {
        await server.deploy(path.join(EXAMPLES, 'echo'))
        progress('first build of debian:bookworm (minbase) from the mirror')
        dirs.push(await echoWithImage('echo-image'))
        const t0 = performance.now()
        await server.deploy(dirs[0] as string)
        await waitReady(server, 'echo-image')
        const firstBuildMs = performance.now() - t0
        dirs.push(await echoWithImage('echo-image-2'))
        const cached = await server.deploy(dirs[1] as string)
        const list = await server.http.json('GET', '/v1/images')
        const image = list.body.data[0] as { sizeBytes: number; buildMs: number; key: string }

        const samples = { host: [] as number[], image: [] as number[] }
        const problems: string[] = []
        const once = async (agent: 'echo' | 'echo-image', keep: boolean) => {
          const session = await server.createSession(agent)
          const t = await server.http.stream(`/v1/sessions/${session.id}/messages`, { prompt: 'hello' })
          if (t.terminal !== 'run.completed' || t.firstDeltaMs === undefined || t.text !== 'hello\n')
            problems.push(`${agent}: ${t.status} ${t.terminal} ${t.error ?? ''} ${JSON.stringify(t.text)}`)
          else if (keep) samples[agent === 'echo' ? 'host' : 'image'].push(session.ms + t.firstDeltaMs)
          await server.deleteSession(session.id)
        }
        for (let i = 0; i < WARMUP; i++)
          for (const agent of ['echo', 'echo-image'] as const) await once(agent, false)
        progress(`${RUNS} cold starts per root, alternating`)
        const { truncated } = await repeat(RUNS, 120_000, async () => {
          for (const agent of ['echo', 'echo-image'] as const) await once(agent, true)
        })
        if (problems.length > 0)
          throw new Error(`image cold starts failed:\n${problems.slice(0, 5).join('\n')}`)
        // The overlay alone: what a sandbox with an image adds (a tmpfs and an overlay mounted in the
        // launcher's own mount namespace, here a process of this bench's; they go with it).
        const mounter = new OverlayMounter()
        const lower = new ImageStore(server.server.runtime.pool).rootfsPath(image.key)
        const scratch = await mkdtemp(path.join(os.tmpdir(), 'cairn-bench-overlay-'))
        const holder = spawn('unshare', ['--mount', '--propagation', 'private', '--', 'sleep', '600'], {
          stdio: 'ignore',
        })
        const ownNs = readlinkSync('/proc/self/ns/mnt')
        const unshared = () => {
          try {
            return readlinkSync(`/proc/${holder.pid}/ns/mnt`) !== ownNs
          } catch {
            return false
          }
        }
        const mountMs: number[] = []
        try {
          if (!(await waitFor(unshared, 5000))) throw new Error('unshare did not make a mount namespace')
          for (let i = 0; i < 100; i++) {
            const a = performance.now()
            await mounter.mountIn(holder.pid as number, scratch, path.join(scratch, `o${i}`), lower, 512)
            mountMs.push(performance.now() - a)
          }
        } finally {
          holder.kill('SIGKILL')
          mounter.close()
          await rm(scratch, { recursive: true, force: true })
        }
        const host = row('echo on the host root: create -> first byte', samples.host, sandboxFloor)
        const onImage = row(
          'echo on a Debian image (overlay): create -> first byte',
          samples.image,
          sandboxFloor,
        )
        const rows: Row[] = [
          host,
          onImage,
          row("writable root: tmpfs + overlay mount, in a launcher's namespace", mountMs),
          row('first build of debian:bookworm minbase: deploy -> READY', [firstBuildMs]),
          row('same recipe again: deploy answer (READY, image reused)', [cached.ms]),
        ]
        const overlayMs = onImage.summary.median - host.summary.median
        const targets: Target[] = [
          {
            name: 'a cold start on an image costs no more than a few ms over the host root (issue 20)',
            goal: 'median difference < 5 ms',
            value: overlayMs,
            met: overlayMs < 5,
          },
        ]
        return {
          config: {
            runs: RUNS,
            warmup: WARMUP,
            recipe: RECIPE.trim(),
            measured:
              'create -> first byte: POST /v1/sessions to the first message.delta of the first message, each session deleted (untimed) after its run; the two agents are examples/echo with and without image:',
            truncated,
          },
          rows,
          targets,
          notes: [
            `image ${image.key}: ${(image.sizeBytes / 1024 / 1024).toFixed(1)} MiB on disk (du of its root), built in ${image.buildMs} ms by the server (mmdebstrap through the egress proxy, chown, seal)`,
            `cold start on the image minus on the host root: ${overlayMs.toFixed(2)} ms (median)`,
          ],
        }
      } finally {
        await server.close()
        for (const dir of dirs) await rm(dir, { recursive: true, force: true })
      }
    }),
}
