#!/usr/bin/env node
// Validates the Kubernetes manifests in deploy/kubernetes without a cluster: every object against
// the official API schemas, failing on unknown fields and wrong types, plus what a schema cannot
// see across objects (selectors that select nothing, a Secret or ConfigMap no one creates, a named
// port that is not there, a YAML file no kustomization uses).
//
// Two generated views of the Kubernetes OpenAPI spec do the per-object work, both maintained npm
// packages: kubernetes-models compiles each kind's JSON schema (types, required fields, formats)
// but lets unknown fields pass, and @kubernetes/client-node's models list every field of every
// type, which is what catches a misspelt or misplaced key (`imagePullPolicyy`, a probe under the
// pod instead of the container). Custom resources of other projects (CloudNativePG, Rook) have no
// schema here: their envelope and metadata are checked, their spec is checked by their operator.
//
// Usage: node scripts/validate-k8s.mjs [dir]   (default deploy/kubernetes; exit 1 on any error)
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import * as clientModelModule from '@kubernetes/client-node/dist/gen/models/ObjectSerializer.js'
import { parseAllDocuments } from 'yaml'

/** Kinds other projects define (custom resources), and the objects their operators create. */
const FOREIGN_KINDS = {
  'postgresql.cnpg.io/v1/Cluster': {
    creates: (name) => [{ kind: 'Secret', name: `${name}-app` }],
  },
  'ceph.rook.io/v1/CephObjectStore': { creates: () => [] },
  'objectbucket.io/v1alpha1/ObjectBucketClaim': {
    creates: (name) => [
      { kind: 'Secret', name },
      { kind: 'ConfigMap', name },
    ],
  },
}

/** client-node's generated model classes by name (`V1PodSpec` → its fields and their types). */
const clientModels = new Map(
  Object.entries(clientModelModule).filter(([, model]) => typeof model?.getAttributeTypeMap === 'function'),
)

const WORKLOAD_KINDS = new Set(['Deployment', 'DaemonSet', 'StatefulSet', 'Job'])

/** The kubernetes-models class of an apiVersion and kind, or undefined when it has none. */
async function schemaModel(apiVersion, kind) {
  const [group, version] = apiVersion.includes('/') ? apiVersion.split('/') : [undefined, apiVersion]
  const specifier = `kubernetes-models/${group ? `${group}/` : ''}${version}/${kind}`
  try {
    const module = await import(specifier)
    return module[kind]
  } catch {
    return undefined
  }
}

/** The client-node model name of a kind (`apps/v1` Deployment → V1Deployment). */
function fieldModelName(apiVersion, kind) {
  const version = apiVersion.split('/').at(-1) ?? ''
  const name = `${version[0]?.toUpperCase()}${version.slice(1)}${kind}`
  return clientModels.has(name) ? name : undefined
}

const isObject = (value) => typeof value === 'object' && value !== null && !Array.isArray(value)

/**
 * Errors of `value` against a client-node type (`V1PodSpec`, `Array<V1Container>`,
 * `{ [key: string]: string; }`, a primitive): unknown fields and wrong JSON types. A null is an
 * absent field, as the API server reads it.
 */
function checkFields(value, type, at, errors, format = '') {
  if (value === null || value === undefined) return
  const array = /^Array<(.+)>$/.exec(type)
  if (array) {
    if (!Array.isArray(value)) return void errors.push(`${at}: must be a list, not ${describe(value)}`)
    for (const [i, item] of value.entries()) checkFields(item, array[1], `${at}[${i}]`, errors)
    return
  }
  const map = /^\{ \[key: string\]: (.+); \}$/.exec(type)
  if (map) {
    if (!isObject(value)) return void errors.push(`${at}: must be a map, not ${describe(value)}`)
    for (const [key, item] of Object.entries(value)) checkFields(item, map[1], `${at}.${key}`, errors)
    return
  }
  switch (type) {
    case 'string':
    case 'Date':
      if (typeof value !== 'string') errors.push(`${at}: must be a string, not ${describe(value)}`)
      return
    case 'boolean':
      if (typeof value !== 'boolean') errors.push(`${at}: must be true or false, not ${describe(value)}`)
      return
    case 'number':
      if (typeof value !== 'number' || (format.startsWith('int') && !Number.isInteger(value)))
        errors.push(
          `${at}: must be ${format.startsWith('int') ? 'an integer' : 'a number'}, not ${describe(value)}`,
        )
      return
    case 'IntOrString':
      if (typeof value !== 'string' && !Number.isInteger(value))
        errors.push(`${at}: must be an integer or a string, not ${describe(value)}`)
      return
    case 'any':
    case 'object':
      return
  }
  const model = clientModels.get(type)
  if (!model) return void errors.push(`${at}: no schema for type ${type}`)
  if (!isObject(value)) return void errors.push(`${at}: must be an object (${type}), not ${describe(value)}`)
  const fields = new Map(model.getAttributeTypeMap().map((a) => [a.baseName, a]))
  for (const [key, item] of Object.entries(value)) {
    const field = fields.get(key)
    if (!field) {
      errors.push(`${at}.${key}: unknown field (${type} has ${[...fields.keys()].join(', ')})`)
      continue
    }
    checkFields(item, field.type, `${at}.${key}`, errors, field.format)
  }
}

function describe(value) {
  return Array.isArray(value)
    ? 'a list'
    : value === null
      ? 'null'
      : `${typeof value} ${JSON.stringify(value)}`
}

/** A workload's pod template, or undefined for other kinds. */
function podTemplate(object) {
  if (!WORKLOAD_KINDS.has(object.kind)) return undefined
  return object.spec?.template
}

function containersOf(object) {
  const spec = podTemplate(object)?.spec
  return [...(spec?.initContainers ?? []), ...(spec?.containers ?? [])]
}

const matches = (selector, labels) =>
  isObject(selector) && Object.entries(selector).every(([key, value]) => labels?.[key] === value)

/**
 * The Secrets and ConfigMaps a pod template reads, optional ones too: a misspelt optional name
 * would turn what it configures off without a word.
 */
function referencesOf(object) {
  const refs = []
  const add = (kind, ref) => {
    if (ref?.name) refs.push({ kind, name: ref.name })
  }
  for (const container of containersOf(object)) {
    for (const env of container.env ?? []) {
      add('Secret', env.valueFrom?.secretKeyRef)
      add('ConfigMap', env.valueFrom?.configMapKeyRef)
    }
    for (const from of container.envFrom ?? []) {
      add('Secret', from.secretRef)
      add('ConfigMap', from.configMapRef)
    }
  }
  for (const volume of podTemplate(object)?.spec?.volumes ?? []) {
    if (volume.secret) add('Secret', { name: volume.secret.secretName })
    add('ConfigMap', volume.configMap)
  }
  return refs
}

/** Checks one object against its kind's schemas; `partial` for patches (no required fields). */
async function checkObject(object, at, errors, { partial }) {
  if (!isObject(object)) return void errors.push(`${at}: not an object`)
  const { apiVersion, kind } = object
  if (typeof apiVersion !== 'string' || typeof kind !== 'string')
    return void errors.push(`${at}: needs apiVersion and kind`)
  const where = `${at} (${kind} ${object.metadata?.name ?? '?'})`
  const foreign = FOREIGN_KINDS[`${apiVersion}/${kind}`]
  if (foreign) {
    for (const key of Object.keys(object))
      if (!['apiVersion', 'kind', 'metadata', 'spec'].includes(key))
        errors.push(`${where}.${key}: unknown field`)
    checkFields(object.metadata, 'V1ObjectMeta', `${where}.metadata`, errors)
    if (!isObject(object.spec)) errors.push(`${where}.spec: must be an object`)
    return
  }
  const modelName = fieldModelName(apiVersion, kind)
  const Model = await schemaModel(apiVersion, kind)
  if (!modelName || !Model) return void errors.push(`${where}: no schema for ${apiVersion} ${kind}`)
  checkFields(object, modelName, where, errors)
  if (partial) return
  try {
    new Model(object).validate()
  } catch (error) {
    errors.push(`${where}: ${error instanceof Error ? error.message : String(error)}`)
  }
}

function parseYamlFile(file, errors) {
  const documents = parseAllDocuments(readFileSync(file, 'utf8'), { version: '1.1', uniqueKeys: true })
  const objects = []
  for (const doc of Array.isArray(documents) ? documents : [documents]) {
    for (const problem of [...doc.errors, ...doc.warnings]) errors.push(`${file}: ${problem.message}`)
    const value = doc.toJS()
    if (value !== null && value !== undefined) objects.push(value)
  }
  return objects
}

function yamlFilesUnder(dir) {
  return readdirSync(dir, { recursive: true })
    .map((entry) => path.join(dir, String(entry)))
    .filter((file) => /\.ya?ml$/.test(file) && statSync(file).isFile())
    .sort()
}

/**
 * Validates every manifest under `root`. Returns the errors (empty when all is well) and what
 * was checked.
 */
export async function validateManifests(root) {
  const errors = []
  const files = yamlFilesUnder(root)
  const roles = new Map() // file → 'resource' | 'patch' | 'kustomization' | 'example'
  for (const file of files) {
    const base = path.basename(file)
    if (base === 'kustomization.yaml' || base === 'kustomization.yml') roles.set(file, 'kustomization')
    else if (base.endsWith('.example.yaml')) roles.set(file, 'example')
  }
  for (const file of files.filter((f) => roles.get(f) === 'kustomization')) {
    const [kustomization] = parseYamlFile(file, errors)
    const dir = path.dirname(file)
    if (kustomization?.kind !== 'Kustomization') errors.push(`${file}: kind must be Kustomization`)
    for (const entry of kustomization?.resources ?? []) {
      const target = path.resolve(dir, entry)
      if (!existsSync(target)) errors.push(`${file}: resource ${entry} does not exist`)
      else if (statSync(target).isDirectory()) {
        if (!existsSync(path.join(target, 'kustomization.yaml')))
          errors.push(`${file}: resource ${entry} is a directory without a kustomization.yaml`)
      } else roles.set(target, 'resource')
    }
    for (const patch of kustomization?.patches ?? []) {
      if (!patch?.path) continue
      const target = path.resolve(dir, patch.path)
      if (!existsSync(target)) errors.push(`${file}: patch ${patch.path} does not exist`)
      else roles.set(target, 'patch')
    }
  }
  const objects = []
  const patches = []
  for (const file of files) {
    const role = roles.get(file)
    if (!role) {
      errors.push(`${file}: no kustomization.yaml lists it (name examples *.example.yaml)`)
      continue
    }
    if (role === 'kustomization') continue
    parseYamlFile(file, errors).forEach((object, i) => {
      const at = `${path.relative(root, file)}#${i + 1}`
      ;(role === 'patch' ? patches : objects).push({ object, at, example: role === 'example' })
    })
  }
  for (const { object, at } of objects) await checkObject(object, at, errors, { partial: false })
  for (const { object, at } of patches) await checkObject(object, at, errors, { partial: true })
  checkAcrossObjects(objects, patches, errors)
  return { errors, files: files.length, objects: objects.length + patches.length }
}

/** What one schema cannot see: references between objects. */
function checkAcrossObjects(objects, patches, errors) {
  const known = new Set()
  for (const { object } of objects) {
    if (!isObject(object)) continue
    known.add(`${object.kind}/${object.metadata?.name}`)
    const foreign = FOREIGN_KINDS[`${object.apiVersion}/${object.kind}`]
    for (const made of foreign?.creates(object.metadata?.name) ?? []) known.add(`${made.kind}/${made.name}`)
  }
  const workloads = objects.filter(({ object }) => podTemplate(object))
  for (const { object, at } of [...objects, ...patches]) {
    if (!isObject(object)) continue
    const where = `${at} (${object.kind} ${object.metadata?.name ?? '?'})`
    for (const ref of referencesOf(object))
      if (!known.has(`${ref.kind}/${ref.name}`))
        errors.push(`${where}: reads ${ref.kind} ${ref.name}, which nothing here creates`)
  }
  for (const { object, at } of workloads) {
    const where = `${at} (${object.kind} ${object.metadata?.name})`
    const labels = object.spec.template.metadata?.labels
    if (!matches(object.spec.selector?.matchLabels, labels))
      errors.push(`${where}: spec.selector.matchLabels does not match the pod template's labels`)
    for (const container of containersOf(object)) {
      const ports = new Set((container.ports ?? []).map((p) => p.name).filter(Boolean))
      for (const probe of ['readinessProbe', 'livenessProbe', 'startupProbe']) {
        const port = container[probe]?.httpGet?.port ?? container[probe]?.tcpSocket?.port
        if (typeof port === 'string' && !ports.has(port))
          errors.push(
            `${where}: ${container.name}.${probe} uses port ${port}, which the container does not name`,
          )
      }
    }
  }
  const selecting = [
    ['Service', (o) => [o.spec?.selector]],
    ['PodDisruptionBudget', (o) => [o.spec?.selector?.matchLabels]],
    [
      'NetworkPolicy',
      (o) => [
        o.spec?.podSelector?.matchLabels,
        ...[...(o.spec?.ingress ?? []).flatMap((rule) => rule.from ?? [])]
          .filter((peer) => peer.podSelector && !peer.namespaceSelector)
          .map((peer) => peer.podSelector.matchLabels),
      ],
    ],
  ]
  const selectedBy = (selector) =>
    workloads.filter(({ object: w }) => matches(selector, w.spec.template.metadata?.labels))
  for (const [kind, selectorsOf] of selecting) {
    for (const { object, at } of objects.filter(({ object }) => object?.kind === kind)) {
      const [selector, ...peers] = selectorsOf(object)
      const selected = selectedBy(selector)
      for (const peer of peers)
        if (selectedBy(peer).length === 0)
          errors.push(
            `${at} (${kind} ${object.metadata?.name}): a pod selector of its rules selects no workload's pods`,
          )
      if (selected.length === 0) {
        errors.push(`${at} (${kind} ${object.metadata?.name}): its selector selects no workload's pods`)
        continue
      }
      if (kind !== 'Service') continue
      const named = new Set(
        selected.flatMap(({ object: w }) =>
          containersOf(w).flatMap((c) => (c.ports ?? []).map((p) => p.name)),
        ),
      )
      for (const port of object.spec.ports ?? [])
        if (typeof port.targetPort === 'string' && !named.has(port.targetPort))
          errors.push(
            `${at} (Service ${object.metadata?.name}): targetPort ${port.targetPort} is no port of its pods`,
          )
    }
  }
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const root = path.resolve(
    process.argv[2] ?? path.join(path.dirname(fileURLToPath(import.meta.url)), '../deploy/kubernetes'),
  )
  const { errors, files, objects } = await validateManifests(root)
  for (const error of errors) console.error(error)
  console.log(
    `${path.relative(process.cwd(), root) || '.'}: ${objects} objects in ${files} files, ${errors.length} error${errors.length === 1 ? '' : 's'}`,
  )
  process.exitCode = errors.length > 0 ? 1 : 0
}
