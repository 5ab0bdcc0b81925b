import { type ChildProcess, execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { readdirSync, readFileSync, statSync } from 'node:fs'
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { DEFAULT_SANDBOX_UID_RANGE } from '../../packages/runtime/src/sandbox/sandbox-uids.js'
import { createNetnsHost, type NetnsHost, netnsAddresses } from '../helpers/netns.js'
import { makeProject } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'

// A test host in its own network namespace (as in egress.test.ts), serving HTTPS with a certificate
// from a CA of the test's own, and plain HTTP; it records the credentials each request carried.
const SUBNET = 232
const { address: TEST_HOST } = netnsAddresses(SUBNET)
let netnsHost: NetnsHost | undefined
/** Bound to the secret: HTTPS 8443 and HTTP 8081. Not bound: HTTPS 9443 and HTTP 8080. */
const PORTS = { boundTls: 8443, freeTls: 9443, boundHttp: 8081, freeHttp: 8080 }
const REAL_VALUE = `sk-real-${randomBytes(12).toString('hex')}`
const SANDBOX_UID = 61000

let t: TestServer
let web: ChildProcess | undefined
let dir = ''
let testCaPem = ''

const openssl = (...args: string[]) => execFileSync('openssl', args, { stdio: 'pipe', cwd: dir })

const HOST_SERVER = `
import gzip, http.server, json, ssl, sys, threading
host, log = sys.argv[1], sys.argv[2]
lock = threading.Lock()
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def echo_back(self, body):
        # Echoes the credential through every standard way of cutting or coding a body.
        auth = self.headers.get("Authorization") or ""
        if self.path == "/echo-range" and self.headers.get("Range", "").startswith("bytes="):
            start, _, end = self.headers["Range"][6:].partition("-")
            start, end = int(start), min(int(end or len(body) - 1), len(body) - 1)
            self.send_response(206)
            self.send_header("content-range", "bytes %d-%d/%d" % (start, end, len(body)))
            body = body[start : end + 1]
        elif self.path == "/echo-gzip":
            # Compressed whatever the request accepts.
            body = gzip.compress(body)
            self.send_response(200)
            self.send_header("content-encoding", "gzip")
        elif self.path == "/echo-chunked":
            self.send_response(200)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for at in range(0, len(body), 3):
                piece = body[at : at + 3]
                self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(piece), piece))
            self.wfile.write(b"0\\r\\n\\r\\n")
            return
        elif self.path == "/echo-headers":
            # Whole, and cut in two halves across two headers.
            self.send_response(200)
            self.send_header("x-echo", auth)
            self.send_header("x-echo-" + auth[-12:], "name")
            self.send_header("x-echo-a", auth[: len(auth) // 2])
            self.send_header("x-echo-b", auth[len(auth) // 2 :])
        else:
            self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        entry = {"port": self.server.server_address[1], "authorization": self.headers.get("Authorization"),
                 "apiKey": self.headers.get("x-api-key")}
        # Headers a host might store and serve back (metadata, comments), and the query: logged when sent.
        for name in ("x-meta", "x-comment"):
            if self.headers.get(name) is not None:
                entry[name] = self.headers.get(name)
        if "?" in self.path:
            entry["query"] = self.path.partition("?")[2]
        with lock, open(log, "a") as f:
            f.write(json.dumps(entry) + "\\n")
        # /echo hands the credential back, as an error message or a "whoami" might.
        if self.path.startswith("/echo"):
            body = ("echo %s\\n" % entry["authorization"]).encode()
        else:
            body = ("ok on %d\\n" % entry["port"]).encode()
        self.echo_back(body)
    def log_message(self, *args):
        pass
def serve(port, tls):
    server = http.server.ThreadingHTTPServer((host, port), Handler)
    if tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain("host.pem", "host.key")
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
serve(${PORTS.boundTls}, True)
serve(${PORTS.freeTls}, True)
serve(${PORTS.boundHttp}, False)
serve(${PORTS.freeHttp}, False)
print("ready", flush=True)
threading.Event().wait()
`

// The agent: calls a URL with its token in Authorization and x-api-key (urllib or curl), keeps
// each answer in the workspace, and dumps everything it can see of its environment there too.
const PROBE = `
import glob, gzip, json, os, ssl, subprocess, urllib.error, urllib.request
token = os.environ["API_TOKEN"]
def get(url, cafile=None):
    request = urllib.request.Request(url, headers={"Authorization": "Bearer " + token, "x-api-key": token})
    context = ssl.create_default_context(cafile=cafile) if cafile else None
    try:
        answer = urllib.request.urlopen(request, timeout=10, context=context).read().decode().strip()
    except Exception as e:
        answer = "ERR " + type(e).__name__ + " " + str(e)[:200]
    with open("responses.txt", "a") as f:
        f.write(answer + "\\n")
    return answer
def curl(url):
    done = subprocess.run(["curl", "-sS", "--max-time", "10", "-H", "Authorization: Bearer " + token, url],
                          capture_output=True, text=True)
    return (done.stdout + done.stderr).strip()
def bare(url):
    # Proxy variables unset: the sandbox's transparent egress carries the request instead.
    unset = ["-u", "HTTP_PROXY", "-u", "http_proxy", "-u", "HTTPS_PROXY", "-u", "https_proxy"]
    done = subprocess.run(["env", *unset, "curl", "-sS", "--max-time", "10", "-H", "Authorization: Bearer " + token, url],
                          capture_output=True, text=True)
    return (done.stdout + done.stderr).strip()
def fetch(url, extra):
    answer = fetched(url, extra)
    with open("fetched.txt", "a") as f:
        f.write(answer + "\\n")
    return answer
def fetched(url, extra):
    # Everything a client sees of an answer, as one line: status, headers, body (gunzipped).
    headers = {"Authorization": "Bearer " + token}
    for pair in extra:
        name, _, value = pair.partition("=")
        headers[name] = value
    try:
        response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10)
        body = response.read()
        if response.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        return json.dumps([response.status, response.headers.items(), body.decode("latin-1")])
    except urllib.error.HTTPError as e:
        return json.dumps([e.code, e.headers.items(), e.read().decode("latin-1")])
    except Exception as e:
        return "ERR " + type(e).__name__ + " " + str(e)[:200]
def dump():
    parts = [subprocess.run(["env"], capture_output=True, text=True).stdout]
    for name in glob.glob("/proc/*/environ"):
        try:
            parts.append(open(name, "rb").read().decode(errors="replace"))
        except Exception:
            pass
    with open("seen.txt", "w") as f:
        f.write("\\n".join(parts))
    return "dumped %d sources" % len(parts)
while True:
    kind, _, arg = input().partition(" ")
    if kind == "get": print(get(arg))
    elif kind == "getca": print(get(arg, "/workspace/test-ca.pem"))
    elif kind == "curl": print(curl(arg))
    elif kind == "fetch": print(fetch(arg.split(" ")[0], arg.split(" ")[1:]))
    elif kind == "bare": print(bare(arg))
    elif kind == "token": print(token)
    elif kind == "dump": print(dump())
    elif kind == "cafile": print(os.environ.get("SSL_CERT_FILE"), os.environ.get("NODE_EXTRA_CA_CERTS"))
`

interface Seen {
  port: number
  authorization: string | null
  apiKey: string | null
}

function seenByHost(): Seen[] {
  return readFileSync(path.join(dir, 'seen.jsonl'), 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((line) => JSON.parse(line) as Seen)
}

function filesUnder(root: string): string[] {
  const out: string[] = []
  for (const name of readdirSync(root)) {
    const full = path.join(root, name)
    const stat = statSync(full, { throwIfNoEntry: false })
    if (stat?.isDirectory()) out.push(...filesUnder(full))
    else if (stat?.isFile()) out.push(full)
  }
  return out
}

/** Whether a host uid is a sandbox's: the shared one, or one of the per-sandbox range (bwrap). */
function isSandboxUid(uid: number): boolean {
  const { first, count } = DEFAULT_SANDBOX_UID_RANGE
  return uid === SANDBOX_UID || (uid >= first && uid < first + count)
}

/** Environments of every process running as a sandbox uid, read from the host. */
function sandboxEnvironments(): string[] {
  const out: string[] = []
  for (const pid of readdirSync('/proc').filter((name) => /^\d+$/.test(name))) {
    try {
      if (!isSandboxUid(statSync(`/proc/${pid}`).uid)) continue
      out.push(readFileSync(`/proc/${pid}/environ`, 'latin1'))
    } catch {}
  }
  return out
}

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-proxy-secrets-'))
  openssl(
    'req',
    '-x509',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:prime256v1',
    '-nodes',
    '-keyout',
    'test-ca.key',
    '-out',
    'test-ca.pem',
    '-days',
    '2',
    '-subj',
    '/CN=proxy-secrets test CA',
    '-addext',
    'basicConstraints=critical,CA:TRUE',
    '-addext',
    'keyUsage=critical,keyCertSign',
  )
  openssl('genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:P-256', '-out', 'host.key')
  openssl(
    'req',
    '-x509',
    '-new',
    '-key',
    'host.key',
    '-CA',
    'test-ca.pem',
    '-CAkey',
    'test-ca.key',
    '-subj',
    `/CN=${TEST_HOST}`,
    '-days',
    '2',
    '-addext',
    `subjectAltName=IP:${TEST_HOST}`,
    '-addext',
    'extendedKeyUsage=serverAuth',
    '-out',
    'host.pem',
  )
  testCaPem = await readFile(path.join(dir, 'test-ca.pem'), 'utf8')
  await writeFile(path.join(dir, 'host_server.py'), HOST_SERVER)
  await writeFile(path.join(dir, 'seen.jsonl'), '')

  netnsHost = createNetnsHost('psec', SUBNET)
  const server = netnsHost.spawn(['python3', 'host_server.py', TEST_HOST, path.join(dir, 'seen.jsonl')], {
    cwd: dir,
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  web = server
  await new Promise<void>((resolve, reject) => {
    server.stdout?.once('data', () => resolve())
    server.once('exit', (code) => reject(new Error(`test host exited with ${code}`)))
  })

  t = await startTestServer({
    server: {
      egressPrivateExceptions: [TEST_HOST],
      egressUpstreamCaFile: path.join(dir, 'test-ca.pem'),
    },
  })
  const allow = Object.values(PORTS).map((port) => `"${TEST_HOST}:${port}"`)
  const project = await makeProject({
    'cairn.yaml': `name: keyed\ncommand: python3 probe.py\nnetwork:\n  allow: [${allow.join(', ')}]\n`,
    'probe.py': PROBE,
    'test-ca.pem': testCaPem,
  })
  expect((await t.api.deploy(project)).status).toBe(201)
  const set = await t.api.call('PUT', '/v1/agents/keyed/secrets', {
    secrets: { API_TOKEN: REAL_VALUE },
    scope: 'proxy',
    hosts: [`${TEST_HOST}:${PORTS.boundTls}`, `${TEST_HOST}:${PORTS.boundHttp}`],
  })
  expect(set.status).toBe(200)
  expect(set.body.data).toEqual([
    expect.objectContaining({
      name: 'API_TOKEN',
      scope: 'proxy',
      hosts: [`${TEST_HOST}:${PORTS.boundTls}`, `${TEST_HOST}:${PORTS.boundHttp}`],
    }),
  ])
})

afterAll(async () => {
  await t?.close()
  web?.kill('SIGKILL')
  netnsHost?.remove()
  if (dir) await rm(dir, { recursive: true, force: true })
})

describe('proxy-scoped secrets', () => {
  it('sends the real value to the bound host while the agent only ever holds a stand-in', async () => {
    const { id } = await t.api.createSession('keyed')
    const standIn = (await t.api.send(id, 'token')).text.trim()
    expect(standIn).toMatch(/^cairn-proxy-secret-[0-9a-f]{32}$/)
    expect((await t.api.send(id, 'cafile')).text).toBe('/run/cairn/ca-bundle.pem /run/cairn/egress-ca.pem\n')

    // HTTPS to the bound host, through urllib and through curl: TLS terminated, value swapped in.
    expect((await t.api.send(id, `get https://${TEST_HOST}:${PORTS.boundTls}/`)).text).toBe(
      `ok on ${PORTS.boundTls}\n`,
    )
    expect((await t.api.send(id, `curl https://${TEST_HOST}:${PORTS.boundTls}/`)).text).toBe(
      `ok on ${PORTS.boundTls}\n`,
    )
    // Plain HTTP to the bound port.
    expect((await t.api.send(id, `get http://${TEST_HOST}:${PORTS.boundHttp}/`)).text).toBe(
      `ok on ${PORTS.boundHttp}\n`,
    )
    // Hosts not bound to the secret: HTTPS stays an opaque tunnel (the agent sees the host's own
    // certificate, so it must trust the test CA itself), and the stand-in arrives unchanged.
    expect((await t.api.send(id, `getca https://${TEST_HOST}:${PORTS.freeTls}/`)).text).toBe(
      `ok on ${PORTS.freeTls}\n`,
    )
    expect((await t.api.send(id, `get http://${TEST_HOST}:${PORTS.freeHttp}/`)).text).toBe(
      `ok on ${PORTS.freeHttp}\n`,
    )

    const seen = seenByHost()
    const at = (port: number) => seen.filter((s) => s.port === port)
    expect(at(PORTS.boundTls)).toEqual([
      { port: PORTS.boundTls, authorization: `Bearer ${REAL_VALUE}`, apiKey: REAL_VALUE },
      { port: PORTS.boundTls, authorization: `Bearer ${REAL_VALUE}`, apiKey: null },
    ])
    expect(at(PORTS.boundHttp)).toEqual([
      { port: PORTS.boundHttp, authorization: `Bearer ${REAL_VALUE}`, apiKey: REAL_VALUE },
    ])
    expect(at(PORTS.freeTls)).toEqual([
      { port: PORTS.freeTls, authorization: `Bearer ${standIn}`, apiKey: standIn },
    ])
    expect(at(PORTS.freeHttp)).toEqual([
      { port: PORTS.freeHttp, authorization: `Bearer ${standIn}`, apiKey: standIn },
    ])

    // A host that echoes the credential back: the agent gets the stand-in again (headers and
    // uncompressed bodies are scrubbed), over TLS and plain HTTP.
    expect((await t.api.send(id, `get https://${TEST_HOST}:${PORTS.boundTls}/echo`)).text).toBe(
      `echo Bearer ${standIn}\n`,
    )
    expect((await t.api.send(id, `get http://${TEST_HOST}:${PORTS.boundHttp}/echo`)).text).toBe(
      `echo Bearer ${standIn}\n`,
    )
    expect(
      seenByHost()
        .slice(-2)
        .map((s) => s.authorization),
    ).toEqual([`Bearer ${REAL_VALUE}`, `Bearer ${REAL_VALUE}`])

    // Nothing the agent can see holds the value: its env and every /proc/*/environ it can read
    // (dumped into the workspace), the workspace itself, the processes' environments read from
    // the host, and the transcript.
    expect((await t.api.send(id, 'dump')).text).toMatch(/^dumped \d+ sources\n$/)
    const workspace = t.server.runtime.pool.workspacePath(id)
    const seenFile = readFileSync(path.join(workspace, 'seen.txt'), 'utf8')
    expect(seenFile).toContain(`API_TOKEN=${standIn}`)
    for (const file of filesUnder(workspace)) expect(readFileSync(file).includes(REAL_VALUE)).toBe(false)
    const environments = sandboxEnvironments()
    expect(environments.some((env) => env.includes(standIn))).toBe(true)
    for (const env of environments) expect(env.includes(REAL_VALUE)).toBe(false)
    const transcript = await t.api.call('GET', `/v1/sessions/${id}/messages`)
    expect(JSON.stringify(transcript.body)).toContain(standIn)
    expect(JSON.stringify(transcript.body)).not.toContain(REAL_VALUE)

    // The CA key stays in the data dir, owner-only; the sandbox gets the certificate alone.
    expect(statSync(path.join(t.dataDir, 'egress-ca', 'ca.key')).mode & 0o777).toBe(0o600)
    expect(statSync(path.join(t.dataDir, 'egress-ca')).mode & 0o777).toBe(0o700)

    const log = await t.api.call('GET', `/v1/sessions/${id}/network`)
    const reasons = log.body.data.map((e: { port: number; reason: string }) => `${e.port} ${e.reason}`)
    expect(reasons).toContainEqual(expect.stringMatching(`^${PORTS.boundTls} .*TLS terminated for API_TOKEN`))
    expect(reasons.filter((r: string) => r.startsWith(`${PORTS.freeTls} `)).join()).not.toContain('TLS')
  })

  it('swaps the value in for clients that ignore the proxy variables too (transparent egress)', async () => {
    const { id } = await t.api.createSession('keyed')
    const standIn = (await t.api.send(id, 'token')).text.trim()
    expect((await t.api.send(id, `bare https://${TEST_HOST}:${PORTS.boundTls}/`)).text).toBe(
      `ok on ${PORTS.boundTls}\n`,
    )
    expect((await t.api.send(id, `bare http://${TEST_HOST}:${PORTS.boundHttp}/`)).text).toBe(
      `ok on ${PORTS.boundHttp}\n`,
    )
    expect((await t.api.send(id, `bare http://${TEST_HOST}:${PORTS.freeHttp}/`)).text).toBe(
      `ok on ${PORTS.freeHttp}\n`,
    )
    expect(seenByHost().slice(-3)).toEqual([
      { port: PORTS.boundTls, authorization: `Bearer ${REAL_VALUE}`, apiKey: null },
      { port: PORTS.boundHttp, authorization: `Bearer ${REAL_VALUE}`, apiKey: null },
      { port: PORTS.freeHttp, authorization: `Bearer ${standIn}`, apiKey: null },
    ])
  })

  it('lets no 8 bytes of the value back to the agent, whether the host echoes it in slices (Range), chunked, compressed or in headers', async () => {
    const { id } = await t.api.createSession('keyed')
    const standIn = (await t.api.send(id, 'token')).text.trim()
    /** Every 8-byte piece of the real value found in `text`. */
    const pieces = (text: string) =>
      [...Array(REAL_VALUE.length - 7).keys()]
        .map((at) => REAL_VALUE.slice(at, at + 8))
        .filter((piece) => text.includes(piece))
    const answers: string[] = []
    for (const base of [`https://${TEST_HOST}:${PORTS.boundTls}`, `http://${TEST_HOST}:${PORTS.boundHttp}`]) {
      // "echo Bearer " is 12 bytes: these two ranges cut the value in halves, then one range each.
      for (const range of ['0-27', '28-100', '12-19', '20-27', '28-35', '36-43'])
        answers.push((await t.api.send(id, `fetch ${base}/echo-range Range=bytes=${range}`)).text)
      answers.push((await t.api.send(id, `fetch ${base}/echo-range Range=bytes=0-27 If-Range=x`)).text)
      for (const path of ['echo-gzip', 'echo-chunked', 'echo-headers'])
        answers.push((await t.api.send(id, `fetch ${base}/${path}`)).text)
      answers.push((await t.api.send(id, `fetch ${base}/echo-gzip Accept-Encoding=gzip`)).text)
    }
    expect(answers.filter((answer) => answer.startsWith('ERR'))).toEqual([])
    // What the agent saw, in the sandbox (the transcript is redacted on the way out).
    const seen = readFileSync(path.join(t.server.runtime.pool.workspacePath(id), 'fetched.txt'), 'latin1')
    expect(seen.split('\n').filter(Boolean)).toHaveLength(answers.length)
    expect(pieces(seen)).toEqual([])
    // The host did get the value each time, and whole echoes still come back as the stand-in.
    expect(
      seenByHost()
        .slice(-answers.length)
        .every((s) => s.authorization === `Bearer ${REAL_VALUE}`),
    ).toBe(true)
    // Each answer whole (no range was asked for), decoded, with the stand-in in place of the value.
    for (const answer of seen.split('\n').filter(Boolean)) {
      expect(answer.startsWith('[200, ')).toBe(true)
      expect(answer).toContain(`echo Bearer ${standIn}\\n`)
    }
  })

  it('swaps the value into credential headers only: a stand-in in a header or query the host stores stays a stand-in', async () => {
    const { id } = await t.api.createSession('keyed')
    const standIn = (await t.api.send(id, 'token')).text.trim()
    const sent = [`https://${TEST_HOST}:${PORTS.boundTls}`, `http://${TEST_HOST}:${PORTS.boundHttp}`]
    for (const base of sent) {
      const answer = (
        await t.api.send(id, `fetch ${base}/store?note=${standIn} X-Meta=${standIn} X-Comment=key:${standIn}`)
      ).text
      expect(answer.startsWith('[200, ')).toBe(true)
    }
    // What the host stores (and could serve to anyone later, unscrubbed) is the stand-in; only the
    // Authorization header carried the real value.
    expect(seenByHost().slice(-2)).toEqual(
      [PORTS.boundTls, PORTS.boundHttp].map((port) => ({
        port,
        authorization: `Bearer ${REAL_VALUE}`,
        apiKey: null,
        'x-meta': standIn,
        'x-comment': `key:${standIn}`,
        query: `note=${standIn}`,
      })),
    )
    // An operator may name another header the host takes the credential in: that one gets the value.
    const bindings = {
      secrets: { API_TOKEN: REAL_VALUE },
      scope: 'proxy',
      hosts: [`${TEST_HOST}:${PORTS.boundTls}`, `${TEST_HOST}:${PORTS.boundHttp}`],
    }
    const declared = await t.api.call('PUT', '/v1/agents/keyed/secrets', { ...bindings, headers: ['X-Meta'] })
    expect(declared.status, JSON.stringify(declared.body)).toBe(200)
    try {
      const { id: next } = await t.api.createSession('keyed')
      expect((await t.api.send(next, 'token')).text.trim()).toBe(standIn)
      await t.api.send(next, `fetch ${sent[0]}/store X-Meta=${standIn} X-Comment=${standIn}`)
      expect(seenByHost().slice(-1)).toEqual([
        {
          port: PORTS.boundTls,
          authorization: `Bearer ${REAL_VALUE}`,
          apiKey: null,
          'x-meta': REAL_VALUE,
          'x-comment': standIn,
        },
      ])
    } finally {
      expect((await t.api.call('PUT', '/v1/agents/keyed/secrets', bindings)).status).toBe(200)
    }
  })

  it('refuses a proxy secret without hosts, and hosts on other scopes', async () => {
    const noHosts = await t.api.call('PUT', '/v1/agents/keyed/secrets', {
      secrets: { OTHER: 'x' },
      scope: 'proxy',
    })
    expect(noHosts.status).toBe(400)
    const stray = await t.api.call('PUT', '/v1/agents/keyed/secrets', {
      secrets: { OTHER: 'x' },
      hosts: ['example.com'],
    })
    expect(stray.status).toBe(400)
    const bad = await t.api.call('PUT', '/v1/agents/keyed/secrets', {
      secrets: { OTHER: 'x' },
      scope: 'proxy',
      hosts: ['/CN=evil'],
    })
    expect(bad.status).toBe(400)
  })
})
