import type { Output } from '../output.js'

/** What `cairn server` and `cairn node` run until a signal. */
export interface Stoppable {
  /** The orderly stop: running turns drained, sandboxes stopped, the pool unmounted, locks dropped. */
  close(): Promise<void>
  /** The same stop without waiting for running turns (cancelled at once); none: as `close`. */
  closeNow?(): Promise<void>
}

/**
 * The first SIGINT or SIGTERM from now on. Called before the process starts what a stop must undo
 * (the pool mounted, the port listened on), so that a signal arriving meanwhile, or the moment its
 * address is printed, is held for `closeOnSignal` instead of ending the process with everything
 * still mounted: Node's default for a signal nobody listens to. A supervisor woken by the printed
 * address can run before the printing process's next statement (seen as a model test's SIGTERM,
 * sent right after a restart printed its URL, killing the server with its pool mounted).
 */
export function listenForStop(): Promise<NodeJS.Signals> {
  return new Promise<NodeJS.Signals>((resolve) => {
    const heard = (signal: NodeJS.Signals) => {
      process.off('SIGINT', heard)
      process.off('SIGTERM', heard)
      resolve(signal)
    }
    process.on('SIGINT', heard)
    process.on('SIGTERM', heard)
  })
}

/**
 * Keeps a long-running process (`cairn server`, `cairn node`) up until SIGINT or SIGTERM, then
 * stops it in order. A second signal while stopping cancels running turns instead of waiting for
 * them (the stop still unmounts everything); a third exits at once, leaving what is mounted to the
 * next start. The process's own children are in process groups of their own, so a Ctrl-C or a
 * `kill -- -PGID` reaches this process alone (see `OWN_PROCESS_GROUP` in the runtime).
 */
export async function closeOnSignal(
  out: Output,
  target: Stoppable,
  stopSignal: Promise<NodeJS.Signals> = listenForStop(),
): Promise<void> {
  const signal = await stopSignal
  out.progress(`Received ${signal}, stopping (again: cancel running turns now)…`)
  let signals = 1
  const again = (next: NodeJS.Signals) => {
    signals += 1
    if (signals === 2 && target.closeNow) {
      out.progress(`Received ${next} again: cancelling running turns, then stopping…`)
      void target.closeNow().catch(() => undefined)
      return
    }
    out.note(`Received ${next} again: exiting now; what is still mounted is reused at the next start.`)
    process.exit(130)
  }
  // A stop waiting on something nothing will ever settle would end the process with exit 0 and
  // everything still mounted: it ends with an error instead.
  const stuck = () => {
    out.note('Stopping did not finish (it waited on something that will not happen); exiting with an error.')
    process.exitCode = 1
  }
  process.on('SIGINT', again)
  process.on('SIGTERM', again)
  process.once('beforeExit', stuck)
  try {
    await target.close()
  } finally {
    process.off('beforeExit', stuck)
    process.off('SIGINT', again)
    process.off('SIGTERM', again)
  }
  out.progress('Stopped.')
}
