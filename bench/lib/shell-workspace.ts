import type { BenchServer } from './server.js'

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
