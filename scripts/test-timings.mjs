#!/usr/bin/env node
// Prints the slowest test files of the last test run, from the JSON reports vitest wrote under
// test-results/ (one per pass: sqlite.json, postgres.json), and each pass's wall time.
// A file's seconds are those test/setup/file-durations-reporter.ts wrote beside the report
// (<pass>.files.json: setup, import, tests and hooks), else the report's span of its tests.
// With --write-durations it also writes those seconds to test/setup/file-durations.json, which
// orders the next runs (test/setup/sequencer.ts), for each pass that has them: after a whole
// pass only, since a pass's list is replaced, not merged.
// Usage: node scripts/test-timings.mjs [--top N] [--write-durations] [report.json …]
import { existsSync, readFileSync, writeFileSync } from 'node:fs'
import path from 'node:path'

const args = process.argv.slice(2)
const topIndex = args.indexOf('--top')
const top = topIndex >= 0 ? Number(args.splice(topIndex, 2)[1]) : 25
const writeIndex = args.indexOf('--write-durations')
const writeDurations = writeIndex >= 0 && args.splice(writeIndex, 1).length > 0
const DURATIONS_PATH = 'test/setup/file-durations.json'
const durations = existsSync(DURATIONS_PATH) ? JSON.parse(readFileSync(DURATIONS_PATH, 'utf8')) : {}
const reports = args.length > 0 ? args : ['test-results/sqlite.json', 'test-results/postgres.json']
const root = process.cwd()

const rows = []
const failures = []
for (const report of reports) {
  if (!existsSync(report)) continue
  const pass = path.basename(report, '.json')
  const json = JSON.parse(readFileSync(report, 'utf8'))
  const filesPath = path.join(path.dirname(report), `${pass}.files.json`)
  const fileSeconds = existsSync(filesPath) ? JSON.parse(readFileSync(filesPath, 'utf8')) : undefined
  if (fileSeconds && writeDurations)
    durations[pass] = Object.fromEntries(Object.entries(fileSeconds).sort((a, b) => b[1] - a[1]))
  let first = Number.POSITIVE_INFINITY
  let last = 0
  for (const file of json.testResults ?? []) {
    const spanMs = Math.max(0, (file.endTime ?? 0) - (file.startTime ?? 0))
    const durationMs = (fileSeconds?.[path.relative(root, file.name)] ?? spanMs / 1000) * 1000
    first = Math.min(first, file.startTime ?? first)
    last = Math.max(last, file.endTime ?? last)
    const failedTests = (file.assertionResults ?? []).filter((t) => t.status === 'failed')
    const failed = failedTests.length
    for (const test of failedTests)
      failures.push({ pass, file: path.relative(root, file.name), test, message: test.failureMessages ?? [] })
    if (file.status === 'failed' && failed === 0 && file.message)
      failures.push({ pass, file: path.relative(root, file.name), test: undefined, message: [file.message] })
    rows.push({ pass, file: path.relative(root, file.name), durationMs, failed })
  }
  const wallS = Number.isFinite(first) ? ((last - first) / 1000).toFixed(0) : '?'
  const files = (json.testResults ?? []).length
  console.log(
    `${pass}: ${files} files, ${json.numTotalTests ?? '?'} tests, ${json.numFailedTests ?? '?'} failed, ${wallS} s wall`,
  )
}
if (writeDurations) {
  writeFileSync(DURATIONS_PATH, `${JSON.stringify(durations, null, 2)}\n`)
  console.log(`wrote ${DURATIONS_PATH}`)
}
if (rows.length === 0) {
  console.log('no test reports found under test-results/')
  process.exit(0)
}
rows.sort((a, b) => b.durationMs - a.durationMs)
const sumS = rows.reduce((total, row) => total + row.durationMs, 0) / 1000
console.log(
  `\nslowest ${Math.min(top, rows.length)} of ${rows.length} file runs (sum of file times ${sumS.toFixed(0)} s; two files run at once):`,
)
console.log('| seconds | pass | file |')
console.log('|--------:|------|------|')
for (const row of rows.slice(0, top)) {
  const mark = row.failed > 0 ? ` (${row.failed} failed)` : ''
  console.log(`| ${(row.durationMs / 1000).toFixed(1)} | ${row.pass} | ${row.file}${mark} |`)
}

// The failures last, whole enough to act on: CI's log is often read only at its head and its end,
// so each failure is printed in short lines, and a one-line summary of every failure closes the output.
const LINES_PER_FAILURE = 40
const LINE_CHARS = 400
const firstLine = (failure) =>
  (
    failure.message
      .join('\n')
      .split('\n')
      .find((line) => line.trim() !== '') ?? ''
  ).slice(0, LINE_CHARS)
for (const failure of failures) {
  const name = failure.test ? ` > ${failure.test.fullName ?? failure.test.title}` : ''
  console.log(`\n== failed (${failure.pass}): ${failure.file}${name} ==`)
  const lines = failure.message.join('\n').split('\n')
  const shown = lines
    .slice(0, LINES_PER_FAILURE)
    .map((line) => (line.length > LINE_CHARS ? `${line.slice(0, LINE_CHARS)} […]` : line))
  console.log(shown.join('\n'))
  if (lines.length > LINES_PER_FAILURE) console.log(`[… ${lines.length - LINES_PER_FAILURE} more lines]`)
}
if (failures.length > 0) {
  console.log(`\n${failures.length} failed:`)
  for (const failure of failures) console.log(`- (${failure.pass}) ${failure.file}: ${firstLine(failure)}`)
}
