import { execFile } from 'node:child_process'
import { cp, readFile, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import type { IDaemonSet } from 'kubernetes-models/apps/v1/DaemonSet'
import type { IDeployment } from 'kubernetes-models/apps/v1/Deployment'
import { describe, expect, it } from 'vitest'
import { parseAllDocuments } from 'yaml'
import { validateManifests } from '../../scripts/validate-k8s.mjs'
import { scratchDir } from '../helpers/scratch.js'

const REPO = fileURLToPath(new URL('../..', import.meta.url))
const MANIFESTS = path.join(REPO, 'deploy/kubernetes')

/** A copy of the manifests with one file's text changed (the change must apply). */
async function plant(file: string, from: string | RegExp, to: string): Promise<string> {
  const dir = await scratchDir('cairn-deploy-k8s-')
  await cp(MANIFESTS, dir, { recursive: true })
  const text = await readFile(path.join(dir, file), 'utf8')
  const changed = text.replace(from, to)
  expect(changed, `the plant in ${file} applies`).not.toBe(text)
  await writeFile(path.join(dir, file), changed)
  return dir
}

async function errorsOf(dir: string): Promise<string[]> {
  return (await validateManifests(dir)).errors
}

/** The object of a kind in a manifest file, parsed as the API server's YAML reader (1.1) does. */
async function objectOf<T>(file: string, kind: string): Promise<T> {
  const text = await readFile(path.join(MANIFESTS, file), 'utf8')
  const objects = parseAllDocuments(text, { version: '1.1' }).map((doc) => doc.toJS())
  return objects.find((o) => o.kind === kind) as T
}

describe('Kubernetes manifests', () => {
  it('validate against the Kubernetes schemas, with every reference between them resolved', async () => {
    const result = await validateManifests(MANIFESTS)
    expect(result.errors).toEqual([])
    expect(result.objects).toBeGreaterThanOrEqual(20)
  })

  it('run the API as the contract says: 2 non-root replicas on a read-only root, probed on /healthz', async () => {
    const deployment = await objectOf<IDeployment>('base/api.yaml', 'Deployment')
    const pod = deployment.spec!.template.spec!
    const api = pod.containers[0]!
    expect(deployment.spec.replicas).toBe(2)
    expect(api.args!.slice(0, 3)).toEqual(['server', '--role', 'api'])
    expect(api.args).toContain('--cluster-dir')
    expect(api.readinessProbe!.httpGet!.path).toBe('/healthz')
    expect(api.livenessProbe!.httpGet!.path).toBe('/healthz')
    expect(pod.securityContext!.runAsNonRoot).toBe(true)
    expect(api.securityContext).toMatchObject({
      readOnlyRootFilesystem: true,
      allowPrivilegeEscalation: false,
      capabilities: { drop: ['ALL'] },
    })
    expect(api.env!.map((e) => e.name)).toEqual(
      expect.arrayContaining(['CAIRN_DATABASE_URL', 'CAIRN_SECRET_KEY']),
    )
  })

  it('run a node per machine that drains itself before it stops, for longer than the drain may take', async () => {
    const daemonSet = await objectOf<IDaemonSet>('base/node.yaml', 'DaemonSet')
    const pod = daemonSet.spec!.template.spec!
    const node = pod.containers[0]!
    expect(node.args![0]).toBe('node')
    expect(node.securityContext!.privileged).toBe(true)
    const preStop = node.lifecycle!.preStop!.exec!.command!.join(' ')
    expect(preStop).toContain('cairn nodes drain "$id"')
    const drainSeconds = 60 * Number(/cairn nodes drain "\$id" --timeout (\d+)m/.exec(preStop)?.[1])
    expect(pod.terminationGracePeriodSeconds).toBeGreaterThan(drainSeconds)
    const hostPaths = pod.volumes!.flatMap((v) => (v.hostPath ? [v.hostPath.path] : []))
    expect(hostPaths).toEqual(['/var/lib/cairn', '/run/cairn'])
  })

  it('fail on an unknown field, naming where it is', async () => {
    const dir = await plant(
      'base/api.yaml',
      'imagePullPolicy: IfNotPresent',
      'imagePullPolicyy: IfNotPresent',
    )
    expect(await errorsOf(dir)).toEqual([
      expect.stringMatching(
        /^base\/api\.yaml#2 \(Deployment cairn-api\)\.spec\.template\.spec\.containers\[0\]\.imagePullPolicyy: unknown field/,
      ),
    ])
  })

  it('fail on a field in the wrong place (a probe on the pod instead of its container)', async () => {
    const dir = await plant(
      'base/node.yaml',
      '      hostNetwork: false\n',
      '      hostNetwork: false\n      livenessProbe:\n        tcpSocket:\n          port: 7443\n',
    )
    expect(await errorsOf(dir)).toEqual([
      expect.stringContaining('.spec.template.spec.livenessProbe: unknown field'),
    ])
  })

  it('fail on a wrong type, from both schemas', async () => {
    const dir = await plant('base/api.yaml', 'replicas: 2', 'replicas: two')
    const errors = await errorsOf(dir)
    expect(errors).toContain(
      'base/api.yaml#2 (Deployment cairn-api).spec.replicas: must be an integer, not string "two"',
    )
    expect(errors).toContain('base/api.yaml#2 (Deployment cairn-api): data/spec/replicas must be integer')
  })

  it('fail on a missing required field', async () => {
    const dir = await plant(
      'base/node.yaml',
      /\n {8}- name: node\n {10}image: cairn\n/,
      '\n        - image: cairn\n',
    )
    expect(await errorsOf(dir)).toContain(
      'base/node.yaml#2 (DaemonSet cairn-node): data/spec/template/spec/containers/0 must have required property name',
    )
  })

  it('fail on a mistake in an overlay patch, where a merge would hide it', async () => {
    const dir = await plant('overlays/rook-ceph/bucket-env.yaml', 'secretRef:', 'secretRefs:')
    expect(await errorsOf(dir)).toEqual([expect.stringContaining('envFrom[2].secretRefs: unknown field')])
  })

  it('fail on a Secret nothing creates, a selector that selects nothing, an unnamed port, a stray file', async () => {
    const secret = await plant('base/api.yaml', 'name: cairn-secret-key', 'name: cairn-secret-keys')
    expect(await errorsOf(secret)).toEqual([
      'base/api.yaml#2 (Deployment cairn-api): reads Secret cairn-secret-keys, which nothing here creates',
    ])
    const selector = await plant(
      'base/node.yaml',
      /component: api\n {6}ports:/,
      'component: apis\n      ports:',
    )
    expect(await errorsOf(selector)).toEqual([
      "base/node.yaml#3 (NetworkPolicy cairn-node): a pod selector of its rules selects no workload's pods",
    ])
    const port = await plant('base/api.yaml', 'targetPort: previews', 'targetPort: preview')
    expect(await errorsOf(port)).toEqual([
      'base/api.yaml#3 (Service cairn-api): targetPort preview is no port of its pods',
    ])
    const stray = await scratchDir('cairn-deploy-k8s-')
    await cp(MANIFESTS, stray, { recursive: true })
    await writeFile(
      path.join(stray, 'base/extra.yaml'),
      'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n',
    )
    expect(await errorsOf(stray)).toEqual([
      `${path.join(stray, 'base/extra.yaml')}: no kustomization.yaml lists it (name examples *.example.yaml)`,
    ])
  })

  it('is the command CI runs: exit 1 with the errors on a planted one, 0 on the real tree', async () => {
    const run = promisify(execFile)
    const ok = await run(process.execPath, ['scripts/validate-k8s.mjs'], { cwd: REPO })
    expect(ok.stdout).toMatch(/deploy\/kubernetes: \d+ objects in \d+ files, 0 errors/)
    const dir = await plant('base/config.yaml', 'CAIRN_LOG_LEVEL: info', 'CAIRN_LOG_LEVEL: [info]')
    const failed = await run(process.execPath, ['scripts/validate-k8s.mjs', dir], { cwd: REPO }).catch(
      (e) => e,
    )
    expect(failed.code).toBe(1)
    expect(failed.stderr).toContain(
      '(ConfigMap cairn-config).data.CAIRN_LOG_LEVEL: must be a string, not a list',
    )
  })
})

describe('the shell the node pod runs', () => {
  const sh = promisify(execFile)

  it('parses (the cgroup move before cairn node, and the preStop drain)', async () => {
    const daemonSet = await objectOf<IDaemonSet>('base/node.yaml', 'DaemonSet')
    const node = daemonSet.spec!.template.spec!.containers[0]!
    const [shell, flag, start] = node.command!
    expect([shell, flag]).toEqual(['/bin/sh', '-c'])
    await sh('/bin/sh', ['-n', '-c', start!])
    await sh('/bin/sh', ['-n', '-c', node.lifecycle!.preStop!.exec!.command![2]!])
  })

  it('preStop stops without draining, and says why, before the admin key exists', async () => {
    const daemonSet = await objectOf<IDaemonSet>('base/node.yaml', 'DaemonSet')
    const preStop = daemonSet.spec!.template.spec!.containers[0]!.lifecycle!.preStop!.exec!.command!
    const { CAIRN_API_KEY: _, ...env } = process.env
    const { stderr } = await sh(preStop[0]!, preStop.slice(1), { env })
    expect(stderr).toContain('not draining')
  })
})
