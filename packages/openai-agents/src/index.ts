import type { Session } from '@cairn/sdk'
import { type ApplyPatchTool, applyPatchTool, type ShellTool, shellTool } from '@openai/agents'
import { CairnEditor } from './editor.js'
import { CairnShell, type CairnShellOptions } from './shell.js'

export { CairnEditor, type CairnEditorOptions } from './editor.js'
export { ClippedText, shareLimit } from './output.js'
export { CairnShell, type CairnShellOptions, DEFAULT_MAX_OUTPUT_CHARS } from './shell.js'

/**
 * The shell and apply_patch tools of an `@openai/agents` agent, both on one Cairn session: its
 * commands run in the session's sandbox, its patches edit the session's `/workspace`.
 */
export function cairnTools(
  session: Pick<Session, 'commands' | 'files'>,
  options: CairnShellOptions = {},
): [ShellTool, ApplyPatchTool] {
  return [
    shellTool({ shell: new CairnShell(session, options) }),
    applyPatchTool({ editor: new CairnEditor(session, { cwd: options.cwd }) }),
  ]
}
