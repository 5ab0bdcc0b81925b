import type { AgentCard } from '@a2a-js/sdk'

/** The security scheme the card names: Cairn's API keys, as bearer tokens. */
export const A2A_SECURITY_SCHEME = 'cairnApiKey'

/** The A2A version served (JSON-RPC binding). */
export const A2A_VERSION = '1.0'
/** The earlier version also served, to clients that send no `A2A-Version` (`message/send` …). */
export const A2A_LEGACY_VERSION = '0.3'

/** Where an agent's A2A endpoint is, under the API's base URL. */
export function a2aPath(agentName: string): string {
  return `/v1/agents/${encodeURIComponent(agentName)}/a2a`
}

const DESCRIPTION = (name: string) =>
  `The Cairn agent ${name}. Each context is a persistent session with its own /workspace ` +
  '(send the contextId of an answer to continue in it); each task is one turn.'
const SCHEME_DESCRIPTION =
  "A Cairn API key (its tenant's agents and sessions only): Authorization: Bearer <key>"
const SKILL = (name: string) => ({
  id: 'converse',
  name: 'Converse',
  description: `Talk to ${name}; its workspace persists across the tasks of a context`,
  tags: ['cairn', 'session'],
})

/** The same card in A2A 0.3's shape, for the clients that ask without `A2A-Version` (0.3's card). */
export function legacyAgentCard(
  agent: { name: string; currentRevisionId: string | null },
  baseUrl: string,
  version: string,
): Record<string, unknown> {
  return {
    protocolVersion: '0.3.0',
    name: agent.name,
    description: DESCRIPTION(agent.name),
    url: `${baseUrl}${a2aPath(agent.name)}`,
    preferredTransport: 'JSONRPC',
    provider: { organization: 'Cairn', url: baseUrl },
    version: agent.currentRevisionId ?? version,
    capabilities: { streaming: true, pushNotifications: false },
    securitySchemes: {
      [A2A_SECURITY_SCHEME]: { type: 'http', scheme: 'bearer', description: SCHEME_DESCRIPTION },
    },
    security: [{ [A2A_SECURITY_SCHEME]: [] }],
    defaultInputModes: ['text/plain'],
    defaultOutputModes: ['text/plain', 'application/json'],
    skills: [SKILL(agent.name)],
  }
}

/**
 * An agent's A2A card: its JSON-RPC endpoint (for 1.0 and 0.3), streaming, no push notifications,
 * Cairn API keys as bearer tokens, text in and text or JSON (a task's files artifact) out.
 */
export function agentCard(
  agent: { name: string; currentRevisionId: string | null },
  baseUrl: string,
  version: string,
): AgentCard {
  return {
    name: agent.name,
    description: DESCRIPTION(agent.name),
    supportedInterfaces: [
      {
        url: `${baseUrl}${a2aPath(agent.name)}`,
        protocolBinding: 'JSONRPC',
        tenant: '',
        protocolVersion: A2A_VERSION,
      },
    ],
    provider: { organization: 'Cairn', url: baseUrl },
    version: agent.currentRevisionId ?? version,
    capabilities: { streaming: true, pushNotifications: false, extensions: [], extendedAgentCard: false },
    securitySchemes: {
      [A2A_SECURITY_SCHEME]: {
        scheme: {
          $case: 'httpAuthSecurityScheme',
          value: {
            scheme: 'Bearer',
            bearerFormat: 'Cairn API key',
            description:
              "A Cairn API key (its tenant's agents and sessions only): Authorization: Bearer <key>",
          },
        },
      },
    },
    securityRequirements: [{ schemes: { [A2A_SECURITY_SCHEME]: { list: [] } } }],
    defaultInputModes: ['text/plain'],
    defaultOutputModes: ['text/plain', 'application/json'],
    skills: [
      {
        ...SKILL(agent.name),
        examples: [],
        inputModes: [],
        outputModes: [],
        securityRequirements: [],
      },
    ],
    signatures: [],
  }
}
