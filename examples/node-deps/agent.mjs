import readline from 'node:readline'
import isNumber from 'is-number'
import pc from 'picocolors'

const rl = readline.createInterface({ input: process.stdin })
rl.on('line', (line) => {
  const verdict = isNumber(line.trim()) ? 'a number' : 'not a number'
  console.log(`${JSON.stringify(line)} is ${verdict}${pc.isColorSupported ? '' : '.'}`)
})
