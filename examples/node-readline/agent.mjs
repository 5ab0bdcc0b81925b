import { appendFileSync, existsSync, readFileSync } from 'node:fs'
import readline from 'node:readline'

const LOG = '/workspace/history.txt'
const rl = readline.createInterface({ input: process.stdin })

for await (const line of rl) {
  appendFileSync(LOG, `${line}\n`)
  const count = existsSync(LOG) ? readFileSync(LOG, 'utf8').split('\n').filter(Boolean).length : 0
  console.log(`You said "${line}". That is message ${count} in this workspace.`)
}
