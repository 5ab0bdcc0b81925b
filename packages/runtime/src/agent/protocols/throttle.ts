import type { Sandbox } from '../../sandbox/driver.js'

/** `AgentProtocol.throttle` of the protocols whose agent answers on stdout. */
export function throttleStdout(sandbox: Sandbox, paused: boolean): void {
  if (paused) sandbox.stdout.pause()
  else sandbox.stdout.resume()
}
