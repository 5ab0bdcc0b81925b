import { Counter, Gauge, Histogram, Registry } from 'prom-client'

/** One value of a gauge read on scrape, with its labels (none for an unlabelled gauge). */
export interface GaugeReading<L extends string = string> {
  labels?: Partial<Record<L, string>>
  value: number
}

export interface ScrapedGauge<L extends string> {
  name: string
  help: string
  /** Every label the readings use (prom-client refuses undeclared ones). */
  labelNames?: readonly L[]
  /** Read at each scrape: a number for an unlabelled gauge, or one reading per label set. */
  read: () => number | GaugeReading<L>[]
}

/**
 * The server's Prometheus metrics, on prom-client with a registry of its own (not the global one:
 * several servers share a process in tests). Counters and histograms are fields, updated where
 * things happen; gauges are read at scrape time (`gauge()`).
 */
export class MetricsRegistry {
  readonly registry = new Registry()
  readonly turns = new Counter({
    name: 'cairn_turns_total',
    help: 'Turns finished, by outcome',
    labelNames: ['outcome'] as const,
    registers: [this.registry],
  })
  readonly turnSeconds = new Histogram({
    name: 'cairn_turn_duration_seconds',
    help: 'Turn duration (prompt sent to outcome)',
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
    registers: [this.registry],
  })
  readonly coldStarts = new Counter({
    name: 'cairn_sandbox_cold_starts_total',
    help: 'Sandboxes started for a turn',
    registers: [this.registry],
  })

  /**
   * Adds a gauge whose values are read at each scrape: `metrics.gauge({ name, help, read: () => n })`,
   * or with labels `{ …, labelNames: ['status'], read: () => [{ labels: { status }, value }] }`.
   * Label sets missing from a reading disappear from the exposition.
   */
  gauge<L extends string>(spec: ScrapedGauge<L>): Gauge<L> {
    const { read } = spec
    return new Gauge<L>({
      name: spec.name,
      help: spec.help,
      labelNames: spec.labelNames ?? [],
      registers: [this.registry],
      collect() {
        const value = read()
        this.reset()
        if (typeof value === 'number') this.set(value)
        else for (const reading of value) this.set(reading.labels ?? {}, reading.value)
      },
    })
  }

  /** The Content-Type of `render()` (Prometheus text format 0.0.4). */
  get contentType(): string {
    return this.registry.contentType
  }

  render(): Promise<string> {
    return this.registry.metrics()
  }
}
