import { existsSync, lstatSync, readlinkSync } from 'node:fs'
import { STUB_NAMESERVER } from '../egress/transparent.js'

/** Host paths bound read-only into every sandbox when they exist. */
export const READ_ONLY_ETC = [
  '/etc/alternatives',
  '/etc/ssl',
  '/etc/ca-certificates',
  '/etc/ld.so.cache',
  '/etc/ld.so.conf',
  '/etc/ld.so.conf.d',
  '/etc/localtime',
  '/etc/nsswitch.conf',
  '/etc/mime.types',
  '/etc/python3',
  '/etc/python3.11',
]

/**
 * bwrap arguments for a read-only root made of the host's /usr (and merged-/usr symlinks), a few
 * /etc files, and generated passwd/group/hosts files.
 */
export function readOnlyRootArgs(generatedEtcDir: string): string[] {
  const args = ['--ro-bind', '/usr', '/usr']
  for (const top of ['/bin', '/sbin', '/lib', '/lib64', '/lib32', '/libx32']) {
    if (!existsSync(top)) continue
    const info = lstatSync(top)
    if (info.isSymbolicLink()) args.push('--symlink', readlinkSync(top), top)
    else args.push('--ro-bind', top, top)
  }
  for (const p of READ_ONLY_ETC) if (existsSync(p)) args.push('--ro-bind', p, p)
  for (const f of ['passwd', 'group', 'hosts', 'hostname', 'resolv.conf']) {
    args.push('--ro-bind', `${generatedEtcDir}/${f}`, `/etc/${f}`)
  }
  return args
}

export const SANDBOX_USER = { name: 'agent', uid: 1000, gid: 1000, home: '/workspace' }

export function generatedEtcFiles(): Record<string, string> {
  return {
    passwd: `root:x:0:0:root:/root:/usr/sbin/nologin\n${SANDBOX_USER.name}:x:${SANDBOX_USER.uid}:${SANDBOX_USER.gid}:Cairn agent:${SANDBOX_USER.home}:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n`,
    group: `root:x:0:\n${SANDBOX_USER.name}:x:${SANDBOX_USER.gid}:\nnogroup:x:65534:\n`,
    hosts: '127.0.0.1\tlocalhost cairn\n::1\tlocalhost ip6-localhost\n',
    hostname: 'cairn\n',
    // The egress forwarder's stub DNS (redirected there by the sandbox's nft rules). A sandbox
    // without egress has no route to it: lookups fail at once, as before.
    'resolv.conf': `# no network unless the session allows egress\nnameserver ${STUB_NAMESERVER}\n`,
  }
}
