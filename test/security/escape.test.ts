import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'

let t: TestServer
let sessionId = ''

beforeAll(async () => {
  t = await startTestServer()
  const probe = [
    'import ctypes, os',
    'libc = ctypes.CDLL(None, use_errno=True)',
    'def errno_of(fn):',
    '    ctypes.set_errno(0)',
    '    r = fn()',
    '    return "ok" if r == 0 else os.strerror(ctypes.get_errno())',
    'def try_open(path, mode):',
    '    try:',
    '        open(path, mode).close()',
    '        return "opened"',
    '    except OSError as e:',
    '        return e.strerror',
    'checks = {',
    '    "mount": lambda: errno_of(lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),',
    '    "unshare": lambda: errno_of(lambda: libc.unshare(0x40000000)),',
    '    "keyctl": lambda: errno_of(lambda: libc.syscall(250, 0, 0, 0, 0, 0)),',
    '    "bpf": lambda: errno_of(lambda: libc.syscall(321, 0, 0, 0)),',
    '    "ptrace": lambda: errno_of(lambda: libc.ptrace(16, 1, 0, 0)),',
    '    "shadow": lambda: try_open("/etc/shadow", "r"),',
    '    "write-usr": lambda: try_open("/usr/cairn-escape", "w"),',
    '    "write-etc": lambda: try_open("/etc/cairn-escape", "w"),',
    '    "write-root": lambda: try_open("/cairn-escape", "w"),',
    '    "docker": lambda: str(os.path.exists("/var/run/docker.sock") or os.path.exists("/run/containerd/containerd.sock")),',
    '    "data-dir": lambda: str(os.path.exists(os.environ.get("PROBE_DATA_DIR", "/root/.cairn"))),',
    '    "root-home": lambda: str(os.path.exists("/root")),',
    '    "env": lambda: ",".join(sorted(k for k in os.environ if not k.startswith(("CAIRN_", "PYTHON", "NODE_", "BASH_")))),',
    '    "caps": lambda: [l for l in open("/proc/self/status") if l.startswith("CapEff")][0].split()[1],',
    '    "nonewprivs": lambda: [l for l in open("/proc/self/status") if l.startswith("NoNewPrivs")][0].split()[1],',
    '}',
    'while True:',
    '    name = input()',
    '    print(checks[name]())',
  ].join('\n')
  const project = await makeProject({
    'cairn.yaml': 'name: probe\ncommand: python3 probe.py\n',
    'probe.py': probe,
  })
  expect((await t.api.deploy(project)).status).toBe(201)
  sessionId = (await t.api.createSession('probe')).id
})

afterAll(async () => {
  await t?.close()
})

const ask = async (check: string) => (await t.api.send(sessionId, check)).text.trim()

describe('escape attempts from inside the sandbox are contained', () => {
  it('refuses host-managing syscalls (seccomp and no capabilities)', async () => {
    for (const check of ['mount', 'unshare', 'keyctl', 'bpf', 'ptrace']) {
      expect(await ask(check), check).toBe('Operation not permitted')
    }
    expect(await ask('caps')).toBe('0000000000000000')
    expect(await ask('nonewprivs')).toBe('1')
  })

  it('cannot read host secrets or write outside /workspace and /tmp', async () => {
    expect(await ask('shadow')).toBe('No such file or directory')
    for (const check of ['write-usr', 'write-etc', 'write-root'])
      expect(await ask(check), check).toBe('Read-only file system')
    expect(await ask('docker')).toBe('False')
    expect(await ask('data-dir')).toBe('False')
    expect(await ask('root-home')).toBe('False')
  })

  it('inherits no host environment variable beyond the allowlist', async () => {
    expect(await ask('env')).toBe('HOME,LANG,PATH,PWD,TMPDIR,USER')
  })
})
