import { spawn } from 'node:child_process'
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'

/** Which runsc and platform a floor is measured with. */
export interface RunscUnderTest {
  path: string
  platform: string
}

function run(binary: string, args: readonly string[], cwd?: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(binary, args, { stdio: ['ignore', 'ignore', 'pipe'], cwd })
    let stderr = ''
    child.stderr.on('data', (chunk: Buffer) => {
      stderr = `${stderr}${chunk.toString('utf8')}`.slice(-2000)
    })
    child.once('error', reject)
    child.once('exit', (code) =>
      code === 0 ? resolve() : reject(new Error(`runsc ${args.join(' ')} exited ${code}: ${stderr.trim()}`)),
    )
  })
}

/**
 * The floor of a resume with memory: `runsc restore` alone, of a checkpoint of a sandbox that runs
 * `sleep` on the host's root (read-only, no network), the image fresh in the page cache. Each
 * sample boots and checkpoints the sandbox untimed, then times `runsc restore --detach`, which
 * returns once the restored sandbox runs; the sandbox is deleted, untimed. `preCreated`: into a
 * sandbox `runsc create` booted beforehand (runsc 20240729 restores into a created container).
 */
export async function runscRestoreFloor(
  config: RunscUnderTest,
  samples: number,
  options: { checkpointFlags?: readonly string[]; preCreated?: boolean } = {},
): Promise<number[]> {
  const checkpointFlags = options.checkpointFlags ?? []
  const dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-bench-restore-'))
  const root = path.join(dir, 'root')
  const bundle = path.join(dir, 'bundle')
  const flags = ['--root', root, `--platform=${config.platform}`, '--network=none']
  const out: number[] = []
  try {
    await mkdir(bundle, { recursive: true })
    await run(config.path, ['spec', '--bundle', bundle, '--', '/bin/sleep', '3600'])
    const spec = JSON.parse(await readFile(path.join(bundle, 'config.json'), 'utf8'))
    spec.root = { path: '/', readonly: true }
    spec.process.terminal = false
    await writeFile(path.join(bundle, 'config.json'), JSON.stringify(spec))
    for (let i = 0; i < samples; i++) {
      const id = `floor-${process.pid}-${i}`
      const image = path.join(dir, `image-${i}`)
      await mkdir(image)
      await run(config.path, [...flags, 'run', '--detach', '--bundle', bundle, id])
      await run(config.path, [...flags, 'checkpoint', ...checkpointFlags, '--image-path', image, id])
      await run(config.path, [...flags, 'delete', '--force', id]).catch(() => undefined)
      // A pre-started restore target: `runsc create` of the same bundle (the sandbox and its gofer
      // booted, nothing run in it), untimed; `runsc restore` then loads the image into it.
      if (options.preCreated) await run(config.path, [...flags, 'create', '--bundle', bundle, id])
      const start = performance.now()
      await run(config.path, [...flags, 'restore', '--detach', '--image-path', image, '--bundle', bundle, id])
      out.push(performance.now() - start)
      await run(config.path, [...flags, 'kill', id, 'KILL']).catch(() => undefined)
      await run(config.path, [...flags, 'delete', '--force', id]).catch(() => undefined)
      await rm(image, { recursive: true, force: true })
    }
    return out
  } finally {
    await rm(dir, { recursive: true, force: true })
  }
}
