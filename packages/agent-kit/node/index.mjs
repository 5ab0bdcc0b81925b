// Cairn agent kit for the `jsonl` protocol, ES module entry:
//   import { turns } from '/opt/cairn/node/index.mjs'
// One implementation, shared with `require('cairn-agent')`.
import kit from './cairn-agent/index.cjs'

export const { Turn, turns, tool, transcript, currentTurn } = kit
export default kit
