import { createConfig, lintFromString } from '@redocly/openapi-core'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { startTestServer, type TestServer } from './helpers/server.js'

/**
 * The server's generated OpenAPI document against Redocly's recommended ruleset (the linter of
 * `@redocly/cli lint`): a valid OpenAPI 3.1 document, every operation with a success and an error
 * answer, every schema well formed. Errors and warnings both fail. What the document says is
 * checked against real answers by the request fuzzer (test/security/fuzz-requests.test.ts).
 */

let t: TestServer
let source = ''

beforeAll(async () => {
  t = await startTestServer()
  source = await (await fetch(`${t.url}/v1/openapi.json`)).text()
})

afterAll(async () => {
  await t?.close()
})

describe('the OpenAPI document', () => {
  it("passes Redocly's recommended lint rules", async () => {
    const config = await createConfig({
      extends: ['recommended'],
      rules: {
        // Operation IDs name SDK methods in generated clients; ours is written by hand, and a
        // made-up ID per route would become a naming contract nobody chose.
        'operation-operationId': 'off',
      },
    })
    const problems = await lintFromString({ source, absoluteRef: 'openapi.json', config })
    const found = problems.map(
      (p) => `${p.severity} ${p.ruleId}: ${p.message} at ${p.location.map((l) => l.pointer).join(', ')}`,
    )
    console.log(`[openapi-lint] ${problems.length} problems (recommended ruleset, operation-operationId off)`)
    expect(found).toEqual([])
  })
})
