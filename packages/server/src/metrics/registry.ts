/**
 * A minimal Prometheus registry (text exposition format 0.0.4): counters, gauges computed on
 * scrape, and histograms. Enough for Cairn's own figures without another dependency.
 */
type Labels = Record<string, string>

function labelText(labels: Labels): string {
  const entries = Object.entries(labels)
  if (entries.length === 0) return ''
  return `{${entries.map(([k, v]) => `${k}="${v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n')}"`).join(',')}}`
}

export class Counter {
  private readonly values = new Map<string, { labels: Labels; value: number }>()
  constructor(
    readonly name: string,
    readonly help: string,
  ) {}
  inc(labels: Labels = {}, by = 1): void {
    const key = labelText(labels)
    const entry = this.values.get(key) ?? { labels, value: 0 }
    entry.value += by
    this.values.set(key, entry)
  }
  render(): string {
    const lines = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} counter`]
    for (const { labels, value } of this.values.values())
      lines.push(`${this.name}${labelText(labels)} ${value}`)
    return lines.join('\n')
  }
}

export class Histogram {
  private readonly series = new Map<
    string,
    { labels: Labels; counts: number[]; sum: number; count: number }
  >()
  constructor(
    readonly name: string,
    readonly help: string,
    private readonly buckets: number[],
  ) {}
  observe(value: number, labels: Labels = {}): void {
    const key = labelText(labels)
    const entry = this.series.get(key) ?? { labels, counts: this.buckets.map(() => 0), sum: 0, count: 0 }
    this.buckets.forEach((bound, i) => {
      if (value <= bound) entry.counts[i] = (entry.counts[i] ?? 0) + 1
    })
    entry.sum += value
    entry.count++
    this.series.set(key, entry)
  }
  render(): string {
    const lines = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} histogram`]
    for (const { labels, counts, sum, count } of this.series.values()) {
      this.buckets.forEach((bound, i) => {
        lines.push(`${this.name}_bucket${labelText({ ...labels, le: String(bound) })} ${counts[i] ?? 0}`)
      })
      lines.push(`${this.name}_bucket${labelText({ ...labels, le: '+Inf' })} ${count}`)
      lines.push(`${this.name}_sum${labelText(labels)} ${sum}`)
      lines.push(`${this.name}_count${labelText(labels)} ${count}`)
    }
    return lines.join('\n')
  }
}

export class Gauge {
  constructor(
    readonly name: string,
    readonly help: string,
    private readonly read: () => { labels: Labels; value: number }[],
  ) {}
  render(): string {
    const lines = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} gauge`]
    for (const { labels, value } of this.read()) lines.push(`${this.name}${labelText(labels)} ${value}`)
    return lines.join('\n')
  }
}

export class MetricsRegistry {
  private readonly metrics: { render(): string }[] = []
  readonly turns = this.add(new Counter('cairn_turns_total', 'Turns finished, by outcome'))
  readonly turnSeconds = this.add(
    new Histogram(
      'cairn_turn_duration_seconds',
      'Turn duration (prompt sent to outcome)',
      [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
    ),
  )
  readonly coldStarts = this.add(
    new Counter('cairn_sandbox_cold_starts_total', 'Sandboxes started for a turn'),
  )

  add<T extends { render(): string }>(metric: T): T {
    this.metrics.push(metric)
    return metric
  }

  render(): string {
    return `${this.metrics.map((m) => m.render()).join('\n')}\n`
  }
}
