import { execFileSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { BwrapDriver } from './bwrap-driver.js'
import type { SandboxSpec } from './driver.js'
import { pickPlatform } from './gvisor-driver.js'
import { layoutKey, SLOT_INIT, shellWord } from './gvisor-pool.js'
import { buildOciSpec, buildSlotOciSpec } from './gvisor-spec.js'
import { defaultPlatform, parseRunscFlags, runscFlags } from './runsc.js'
import { DENIED_SYSCALLS_X86_64 } from './seccomp.js'

const spec: SandboxSpec = {
  id: 'sbx_spec',
  workspaceDir: '/pool/sessions/ses_a',
  runDir: '/run/cairn/x/sandboxes/sbx_spec',
  command: ['python3', 'agent.py'],
  env: { CAIRN_TURN: '1', FOO: 'bar=baz' },
  limits: { memoryMiB: 64, pids: 16, cpus: 1 },
  binds: [{ source: '/pool/envs/e1', dest: '/env', readOnly: true }],
}
const options = { rootfsDir: '/state/rootfs', kitDir: '/state/kit', hostUid: 61000, hostGid: 61000 }

interface Oci {
  process: { env: string[]; user: { uid: number }; cwd: string; capabilities: Record<string, string[]> }
  root: { readonly: boolean }
  mounts: { destination: string; source: string; options?: string[] }[]
  linux: { namespaces: { type: string }[]; uidMappings: { containerID: number; hostID: number }[] }
}

describe('gVisor OCI spec', () => {
  it('gives the agent exactly the environment the bwrap driver gives it', () => {
    const oci = buildOciSpec(spec, options) as unknown as Oci
    const args = new BwrapDriver({
      cgroups: undefined as never,
      hostUid: 61000,
      hostGid: 61000,
      etcDir: '/etc-gen',
      kitDir: '/kit',
    }).envArgs(spec)
    const bwrapEnv: string[] = []
    args.forEach((arg, i) => {
      if (arg === '--setenv') bwrapEnv.push(`${args[i + 1]}=${args[i + 2]}`)
    })
    // bwrap adds PWD itself, for its --chdir.
    expect(oci.process.env).toEqual([...bwrapEnv, 'PWD=/workspace'])
  })

  it('runs uid 1000 as the host sandbox uid, without capabilities, on a read-only root', () => {
    const oci = buildOciSpec(spec, options) as unknown as Oci
    expect(oci.process.user.uid).toBe(1000)
    expect(oci.process.cwd).toBe('/workspace')
    expect(Object.values(oci.process.capabilities).flat()).toEqual([])
    expect(oci.root.readonly).toBe(true)
    expect(oci.linux.uidMappings).toContainEqual({ containerID: 1000, hostID: 61000, size: 1 })
    expect(oci.linux.namespaces.map((n) => n.type)).toContain('network')
    const mount = (dest: string) => oci.mounts.find((m) => m.destination === dest)
    expect(mount('/workspace')).toMatchObject({ source: spec.workspaceDir, options: ['rbind', 'rw'] })
    expect(mount('/run/cairn')).toMatchObject({ source: spec.runDir, options: ['rbind', 'ro'] })
    expect(mount('/opt/cairn')).toMatchObject({ source: '/state/kit', options: ['rbind', 'ro'] })
    expect(mount('/env')).toMatchObject({ source: '/pool/envs/e1', options: ['rbind', 'ro'] })
    expect(mount('/usr')?.options).toEqual(['rbind', 'ro'])
  })

  it("carries bwrap's seccomp allow list, and refuses new user namespaces, for runsc --oci-seccomp", () => {
    const oci = buildOciSpec(spec, options) as unknown as {
      linux: { seccomp?: { defaultAction: string; syscalls: { names: string[]; action: string }[] } }
    }
    if (process.arch !== 'x64') return expect(oci.linux.seccomp).toBeUndefined()
    expect(oci.linux.seccomp?.defaultAction).toBe('SCMP_ACT_ERRNO')
    const allowed = oci.linux.seccomp?.syscalls.filter((rule) => rule.action === 'SCMP_ACT_ALLOW')
    const names = allowed?.flatMap((rule) => rule.names) ?? []
    expect(names).toEqual(expect.arrayContaining(['read', 'clone', 'ioctl']))
    // clone3's flags are out of a filter's reach: ENOSYS (a trace with no tracer) sends libc to clone.
    expect(oci.linux.seccomp?.syscalls).toContainEqual({ names: ['clone3'], action: 'SCMP_ACT_TRACE' })
    for (const denied of Object.keys(DENIED_SYSCALLS_X86_64)) expect(names).not.toContain(denied)
    expect(runscFlags({ path: 'runsc', root: '/r', platform: 'ptrace' })).toContain('--oci-seccomp')
  })

  it('keys pool slots by mount points and network, not by sources', () => {
    expect(layoutKey(spec)).toBe(layoutKey({ ...spec, binds: [{ ...spec.binds![0]!, source: '/other' }] }))
    expect(layoutKey(spec)).not.toBe(layoutKey({ ...spec, binds: [] }))
    expect(layoutKey(spec)).not.toBe(layoutKey({ ...spec, network: 'egress' }))
  })

  it('quotes words for the slot init line so the waiting init gives them back unchanged', () => {
    const words = ['plain', "it's", 'two\nlines', '$HOME `x` "q" \\ *', '']
    const line = `exec printf '%s\\0' ${words.map(shellWord).join(' ')}\n`
    const out = execFileSync('/bin/sh', ['-c', SLOT_INIT], { input: `${line}left for the agent\n` })
    expect(out.toString().split('\0').slice(0, -1)).toEqual(words)
    // The init reads its line and nothing more: the rest of stdin is the agent's.
    const rest = execFileSync('/bin/sh', ['-c', SLOT_INIT], { input: 'exec cat\nfirst message\nsecond\n' })
    expect(rest.toString()).toBe('first message\nsecond\n')
  })

  it('gives a pool slot a writable per-slot root with no per-session mount in it', () => {
    const oci = buildSlotOciSpec(spec, '/state/slots/gvpool_1/root', options) as unknown as Oci & {
      root: { path: string }
    }
    expect(oci.root).toEqual({ path: '/state/slots/gvpool_1/root', readonly: false })
    expect(oci.process.cwd).toBe('/')
    const dests = oci.mounts.map((m) => m.destination)
    for (const late of ['/workspace', '/run/cairn', '/env']) expect(dests).not.toContain(late)
    expect(oci.mounts.find((m) => m.destination === '/etc')).toMatchObject({
      source: '/state/rootfs/etc',
      options: ['rbind', 'ro'],
    })
    expect(dests).toContain('/opt/cairn')
  })

  it("binds the statx shim into an image's root, whose /etc is not the driver's", () => {
    const shim = {
      library: '/state/rootfs/etc/cairn-gvisor/statx-fix.so',
      preload: '/state/rootfs/etc/ld.so.preload',
    }
    const image = buildOciSpec(
      { ...spec, rootfs: '/pool/images/debian-1/rootfs' },
      { ...options, imageStatxShim: shim },
    ) as unknown as Oci
    expect(image.mounts).toContainEqual({
      destination: '/etc/cairn-gvisor/statx-fix.so',
      type: 'bind',
      source: shim.library,
      options: ['rbind', 'ro'],
    })
    expect(image.mounts).toContainEqual({
      destination: '/etc/ld.so.preload',
      type: 'bind',
      source: shim.preload,
      options: ['rbind', 'ro'],
    })
    // The host's root has the shim in its own /etc already.
    const host = buildOciSpec(spec, { ...options, imageStatxShim: shim }) as unknown as Oci
    expect(host.mounts.map((m) => m.destination)).not.toContain('/etc/ld.so.preload')
  })
})

describe('runsc flags', () => {
  it('reads the platforms and the overlay flag of a release', () => {
    const old = parseRunscFlags(
      '  -platform string\n    \tspecifies which platform to use: ptrace (default), kvm. (default "ptrace")\n',
    )
    expect(old).toEqual({ platforms: ['ptrace', 'kvm'], featureFlags: [] })
    expect(defaultPlatform(old.platforms)).toBe('ptrace')
    const recent = parseRunscFlags(
      '  -overlay2 value\n  -platform string\n    \tspecifies which platform to use: systrap (default), ptrace, kvm. (default "systrap")\n',
    )
    expect(recent).toEqual({ platforms: ['systrap', 'ptrace', 'kvm'], featureFlags: ['--overlay2=none'] })
    expect(defaultPlatform(recent.platforms)).toBe('systrap')
  })

  it('runs on ptrace, saying why, when systrap does not start a sandbox; the named platform wins', async () => {
    // A runsc whose every sandbox fails to start, as on a host that refuses systrap's stubs.
    const dir = mkdtempSync(path.join(tmpdir(), 'cairn-fake-runsc-'))
    const failing = path.join(dir, 'runsc')
    writeFileSync(failing, '#!/bin/sh\necho "cannot create stub process" >&2\nexit 1\n', { mode: 0o755 })
    try {
      const fell = await pickPlatform({ path: failing }, ['systrap', 'ptrace', 'kvm'], undefined)
      expect(fell).toEqual({
        platform: 'ptrace',
        reason: expect.stringMatching(/^systrap did not start.*stub/),
      })
      expect(await pickPlatform({ path: failing }, ['ptrace', 'kvm'], undefined)).toEqual({
        platform: 'ptrace',
      })
      expect(await pickPlatform({ path: failing }, ['systrap', 'ptrace'], 'kvm')).toEqual({ platform: 'kvm' })
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})
