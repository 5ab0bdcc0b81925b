/** Version of the HTTP API and its schemas; bumped on any breaking change of the wire format. */
export const API_VERSION = '2026-11-22'
/** Version of the frames exchanged with agents (jsonl protocol) and of the stdio turn marker. */
export const AGENT_PROTOCOL_VERSION = 1
/** Version of persisted records (database rows holding JSON, transcript files handed to agents). */
export const PERSISTED_FORMAT_VERSION = 1
