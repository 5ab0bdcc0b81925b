import type { BenchServer } from './server.js'
import { type Row, row, summarize } from './stats.js'

export const count = (n: number) => n.toLocaleString('en-US')

/** A command for the shell agent that fills /workspace/data up to `total` files (2 come with the project). */
export function fillCommand(total: number): string {
  return `for ((i=0;i<${total - 2};i++)); do d=data/d$((i/500)); ((i%500==0)) && mkdir -p $d; echo "file $i" > $d/f$i.txt; done; find . -type f | wc -l`
}

/** Sends one line to the shell agent and checks the reply. */
export async function shell(server: BenchServer, id: string, command: string): Promise<string> {
  const t = await server.http.stream(`/v1/sessions/${id}/messages`, { prompt: command })
  if (t.terminal !== 'run.completed' || !t.text.endsWith('[exit 0]\n'))
    throw new Error(`shell turn failed: ${t.status} ${t.terminal} ${t.error ?? ''} ${t.text.slice(-200)}`)
  return t.text
}

/** A POST that must answer `status`: any other answer stops the bench. */
export async function postExpecting(server: BenchServer, route: string, body: unknown, status: number) {
  const res = await server.http.json('POST', route, body)
  if (res.status !== status) throw new Error(`${route}: ${res.status} ${JSON.stringify(res.body)}`)
  return res
}

/** Timings per operation and workspace size, keyed by their row name: `<op> (<n> files)`. */
export class SizeSamples {
  private readonly byName = new Map<string, number[]>()

  add(size: number, op: string, ms: number): void {
    const name = sizeRow(op, size)
    const samples = this.byName.get(name)
    if (samples) samples.push(ms)
    else this.byName.set(name, [ms])
  }

  median(op: string, size: number): number {
    return summarize(this.byName.get(sizeRow(op, size)) ?? []).median
  }

  /** Per size: a row per op against the median of `floorOp` (e.g. `cp -a`), then the floor's own row. */
  rows(sizes: readonly number[], ops: readonly string[], floorOp: string): Row[] {
    const rows: Row[] = []
    for (const size of sizes) {
      const floor = { name: sizeRow(floorOp, size), median: this.median(floorOp, size) }
      for (const op of ops) rows.push(row(sizeRow(op, size), this.byName.get(sizeRow(op, size)) ?? [], floor))
      rows.push(row(floor.name, this.byName.get(floor.name) ?? []))
    }
    return rows
  }
}

const sizeRow = (op: string, size: number) => `${op} (${count(size)} files)`
