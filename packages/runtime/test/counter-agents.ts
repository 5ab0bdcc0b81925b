/**
 * Agents for the memory-checkpoint tests (the runtime's and the server's `pause: memory`).
 *
 * A REPL-style counter: its count in memory, a `python3 -m http.server` preview started on its
 * first message, and each reply says the count, the start time of its pid namespace's init (field
 * 22 of /proc/1/stat; under gVisor counted from the sandbox's boot), a token drawn when the agent
 * started (a restarted agent has another) and what the preview answers from inside the sandbox.
 */
export const COUNTER_AGENT = `
import os, subprocess, urllib.request, time
count = 0
token = os.urandom(6).hex()
preview = None
def init_start():
    return open("/proc/1/stat").read().rsplit(")", 1)[1].split()[19]
def ask_preview():
    err = ""
    for _ in range(50):
        try:
            return str(urllib.request.urlopen("http://127.0.0.1:8000/", timeout=2).status)
        except Exception as e:
            err = type(e).__name__
            time.sleep(0.1)
    return "ERR " + err
while True:
    input()
    count += 1
    if preview is None:
        preview = subprocess.Popen(["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"],
                                   cwd="/tmp", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"count={count} init={init_start()} token={token} preview={ask_preview()}")
`

/** The same counter in Node: a readline loop, its count and token only in the process's memory. */
export const NODE_COUNTER_AGENT = `
const crypto = require('node:crypto')
const fs = require('node:fs')
let count = 0
const token = crypto.randomBytes(6).toString('hex')
const init = fs.readFileSync('/proc/1/stat', 'utf8').split(')').pop().trim().split(/\\s+/)[19]
const rl = require('node:readline').createInterface({ input: process.stdin })
rl.on('line', () => {
  count++
  console.log('count=' + count + ' init=' + init + ' token=' + token + ' preview=none')
})
`
