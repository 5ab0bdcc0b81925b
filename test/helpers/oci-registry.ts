import { type ChildProcess, execFileSync, spawn } from 'node:child_process'
import { copyFileSync, mkdirSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import type { NetnsHost } from './netns.js'

export const run = (file: string, ...args: string[]) => execFileSync(file, args, { stdio: 'pipe' }).toString()

/** The registries a test file started (killed in its afterAll). */
export const registries: ChildProcess[] = []

/** Pushes the OCI layout's `1.4` tag to `reference` on a plain-HTTP test registry. */
export function pushImage(layout: string, reference: string): void {
  run('skopeo', 'copy', '--quiet', '--dest-tls-verify=false', `oci:${layout}:1.4`, `docker://${reference}`)
}

/** The digest a plain-HTTP test registry answers for `reference`. */
export function imageDigest(reference: string): string {
  return run(
    'skopeo',
    'inspect',
    '--tls-verify=false',
    '--format',
    '{{.Digest}}',
    `docker://${reference}`,
  ).trim()
}

/** Starts docker-registry on `addr` (inside the test host's namespace when `host` is given) and waits for it. */
export async function startRegistry(storage: string, addr: string, host?: NetnsHost): Promise<void> {
  const config = path.join(storage, `config-${registries.length}.yml`)
  writeFileSync(
    config,
    `version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: ${storage}/data\nhttp:\n  addr: ${addr}\n`,
  )
  const argv = ['docker-registry', 'serve', config]
  registries.push(
    host ? host.spawn(argv, { stdio: 'ignore' }) : spawn(argv[0] ?? '', argv.slice(1), { stdio: 'ignore' }),
  )
  for (let i = 0; i < 100; i++) {
    try {
      await fetch(`http://${addr}/v2/`)
      return
    } catch {
      await new Promise((r) => setTimeout(r, 100))
    }
  }
  throw new Error(`registry on ${addr} did not start`)
}

/**
 * An image of a few files: dash (and the two libraries it needs), a marker and the agent's script;
 * `alter` changes its root before it is packed (an attack's image).
 */
export function buildImage(dir: string, alter?: (rootfs: string) => void): string {
  const layout = path.join(dir, 'layout')
  const bundle = path.join(dir, 'bundle')
  run('umoci', 'init', '--layout', layout)
  run('umoci', 'new', '--image', `${layout}:1.4`)
  run('umoci', 'unpack', '--image', `${layout}:1.4`, bundle)
  const rootfs = path.join(bundle, 'rootfs')
  for (const [from, to] of [
    ['/usr/bin/dash', 'bin/sh'],
    ['/lib/x86_64-linux-gnu/libc.so.6', 'lib/x86_64-linux-gnu/libc.so.6'],
    ['/lib64/ld-linux-x86-64.so.2', 'lib64/ld-linux-x86-64.so.2'],
  ] as const) {
    mkdirSync(path.dirname(path.join(rootfs, to)), { recursive: true })
    copyFileSync(from, path.join(rootfs, to))
  }
  execFileSync('chmod', ['755', path.join(rootfs, 'bin/sh')])
  mkdirSync(path.join(rootfs, 'etc'), { recursive: true })
  writeFileSync(path.join(rootfs, 'etc/cairn-marker'), 'built by the OCI test\n')
  // exec protocol: the prompt on stdin, the reply on stdout. Builtins only (the image has no coreutils).
  writeFileSync(
    path.join(rootfs, 'agent.sh'),
    [
      'read -r prompt',
      'read -r marker < /etc/cairn-marker',
      'case "$prompt" in',
      '  write) echo written > /etc/note && echo "wrote /etc/note";;',
      '  tamper) echo tampered > /etc/cairn-marker && echo "echo owned" > /agent.sh && echo tampered;;',
      '  read) if [ -e /etc/note ]; then echo "note present"; else echo "no note"; fi;;',
      '  *) if [ -e /usr/bin/python3 ]; then h=host; else h=image; fi; echo "marker: $marker, root: $h";;',
      'esac',
      '',
    ].join('\n'),
  )
  alter?.(rootfs)
  run('umoci', 'repack', '--image', `${layout}:1.4`, bundle)
  return layout
}
