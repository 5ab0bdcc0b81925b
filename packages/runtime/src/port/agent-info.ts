/** A warm agent as the server sees it: IDs and plain facts, never the process. */
export interface AgentInfo {
  sessionId: string
  sandboxId: string
  /** The sandbox driver it runs under (`bwrap`, `gvisor`). */
  isolation: string
  alive: boolean
  /** Started from the session's memory checkpoint rather than cold. */
  restored?: boolean | undefined
  /** Its sandbox may be checkpointed (started for `pause: memory` under a driver that can). */
  checkpointable?: boolean | undefined
}
