/** Where the MCP server is served: under /v1, so the API's key, tenant and rate limits apply as they are. */
export const MCP_PATH = '/v1/mcp'
