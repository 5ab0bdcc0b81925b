import { copyFile, mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { instanceRunDir } from '@cairn/runtime'
import type fc from 'fast-check'
import { releasePoolImage } from '../helpers/scratch.js'
import { ModelClient, Violation } from './client.js'
import { InFlightFault, inFlight } from './faults.js'
import type { Bed } from './runner.js'
import { mountsUnder, ServerProcess } from './server-process.js'
import type { Step } from './step.js'
import { Real, STOP_BOUND_MS, type Stats } from './system.js'

/** The single-server test bed: one `cairn server` on its data dir, restarted after faults. */
export class SingleServer extends Real {
  private constructor(
    public server: ServerProcess,
    stats: Stats,
  ) {
    super(new ModelClient([server.url], server.key), stats)
  }

  static async start(workDir: string, stats: Stats): Promise<SingleServer> {
    return new SingleServer(await ServerProcess.start(workDir), stats)
  }

  logTail(lines: number): string {
    return this.server.logTail(lines)
  }

  async restart(): Promise<void> {
    this.server = await ServerProcess.start(this.server.workDir)
    this.client = new ModelClient([this.server.url], this.server.key)
  }

  /** Stops the server (SIGTERM, or to its group) and checks the stop invariants. */
  async stopAndCheck(how: 'pid' | 'group'): Promise<void> {
    const exit =
      how === 'pid'
        ? await this.server.stop(STOP_BOUND_MS)
        : await this.server.signalGroup('SIGTERM', STOP_BOUND_MS)
    this.stats.count(this.stats.invariants, 'stops within bound')
    if (exit === undefined)
      throw new Violation(
        `SIGTERM (${how}): the server still ran ${STOP_BOUND_MS} ms later; its processes:\n${this.server.lastTree}\nits log:\n${this.server.logTail(8)}`,
      )
    this.stats.count(this.stats.invariants, 'nothing mounted after stop')
    const left = mountsUnder(this.server.runDir)
    if (left.length > 0)
      throw new Violation(
        `SIGTERM (${how}): exited ${JSON.stringify(exit)} leaving ${left.length} mounts under ${this.server.runDir}: ${left.slice(0, 5).join(', ')}`,
      )
  }
}

/** kill -9 of the server process (its sandboxes live on), then a start on the same data dir. */
export class KillServer extends InFlightFault<SingleServer> {
  readonly kind = 'kill -9 server'
  protected get label() {
    return 'kill -9 server'
  }
  protected async strike(real: SingleServer) {
    await real.server.kill9()
  }
  protected async recover(real: SingleServer) {
    await real.restart()
  }
}

/**
 * SIGTERM to the server's process group (a terminal's Ctrl-C, systemd's KillMode=control-group):
 * the server must exit within the stop bound leaving nothing mounted; then it is started again.
 */
export class TerminateGroup extends InFlightFault<SingleServer> {
  readonly kind = 'SIGTERM process group'
  protected get label() {
    return 'SIGTERM group'
  }
  protected async strike(real: SingleServer) {
    await real.stopAndCheck('group')
  }
  protected async recover(real: SingleServer) {
    await real.restart()
  }
}

export function serverFaults(): fc.Arbitrary<Step<SingleServer>>[] {
  return [
    inFlight.map(([f, t, d]) => new KillServer(f, t, d)),
    inFlight.map(([f, t, d]) => new TerminateGroup(f, t, d)),
  ]
}

/** A fresh server and data dir for each sequence (SQLite or PostgreSQL as the suite runs). */
export class SingleServerBed implements Bed<SingleServer> {
  private readonly workDirs = new Set<string>()

  async begin(stats: Stats): Promise<SingleServer> {
    const workDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-model-'))
    this.workDirs.add(workDir)
    return await SingleServer.start(workDir, stats)
  }

  async finish(real: SingleServer): Promise<void> {
    await real.stopAndCheck('pid')
  }

  async end(real: SingleServer | undefined, failed: boolean, seed: number): Promise<void> {
    const workDir = real?.server.workDir ?? [...this.workDirs].at(-1)
    if (workDir) await this.teardown(workDir, failed ? seed : undefined)
  }

  async close(): Promise<void> {
    for (const dir of this.workDirs) await this.teardown(dir)
  }

  /** Leaves nothing running or mounted for `workDir`'s data dir, then removes it. */
  private async teardown(workDir: string, failedSeed?: number): Promise<void> {
    await ServerProcess.stopAll(workDir, STOP_BOUND_MS)
    if (failedSeed !== undefined) {
      const kept = path.join(os.tmpdir(), `cairn-model-${failedSeed}.log`)
      await copyFile(path.join(workDir, 'server.log'), kept).catch(() => undefined)
      process.stdout.write(`[model] its server log: ${kept} (the last failing one kept)\n`)
    }
    const dataDir = ServerProcess.dataDirOf(workDir)
    if (mountsUnder(instanceRunDir(dataDir)).length > 0) {
      // A server killed last left its mounts: one started on the data dir takes them over and a
      // graceful stop removes them.
      const again = await ServerProcess.start(workDir).catch(() => undefined)
      await again?.stop(STOP_BOUND_MS)
    }
    releasePoolImage(path.join(dataDir, 'pool.img'))
    await rm(workDir, { recursive: true, force: true })
    this.workDirs.delete(workDir)
  }
}
