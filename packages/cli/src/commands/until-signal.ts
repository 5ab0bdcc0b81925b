import type { Output } from '../output.js'

/**
 * Keeps a long-running process (`cairn server`, `cairn node`) up until SIGINT or SIGTERM, then
 * closes it; a second signal while closing stops at once.
 */
export async function closeOnSignal(out: Output, close: () => Promise<void>): Promise<void> {
  const signal = await new Promise<NodeJS.Signals>((resolve) => {
    process.once('SIGINT', resolve)
    process.once('SIGTERM', resolve)
  })
  out.progress(`Received ${signal}, stopping…`)
  const force = () => process.exit(130)
  process.once('SIGINT', force)
  process.once('SIGTERM', force)
  await close()
  process.off('SIGINT', force)
  process.off('SIGTERM', force)
  out.progress('Stopped.')
}
