/**
 * The node's bounds on resident pauses (docs/architecture/pausing.md, "Two tiers"): at most `max`
 * sandboxes frozen in place at once (the oldest released to make room), each released after
 * `idleMs` frozen. Either at 0 turns resident pauses off: keep-warm's end releases at once.
 */
export interface ResidentBounds {
  max: number
  idleMs: number
}

/** Default bounds: 16 frozen sandboxes per node, each for at most 10 minutes. */
export const DEFAULT_RESIDENT_BOUNDS: ResidentBounds = { max: 16, idleMs: 10 * 60_000 }
