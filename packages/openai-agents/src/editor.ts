import { CairnError, type Files } from '@cairn/sdk'
import { type ApplyPatchOperation, type ApplyPatchResult, applyDiff, type Editor } from '@openai/agents'

type Operation<T extends ApplyPatchOperation['type']> = Extract<ApplyPatchOperation, { type: T }>

export interface CairnEditorOptions {
  /** Directory relative paths are taken from, relative to /workspace (default: /workspace). */
  cwd?: string | undefined
}

/** A failure the model caused and can act on: it gets the message as the call's `failed` output. */
class EditRefused extends Error {}

/** Codes of API errors that say what was wrong with the model's edit (a bad path, a missing file, …). */
const MODEL_FAULT_CODES = new Set([
  'bad_request',
  'validation_failed',
  'not_found',
  'payload_too_large',
  'quota_exceeded',
])

/**
 * The Agents SDK's `Editor` (for `applyPatchTool`) on a Cairn session's files API: the SDK's own
 * `applyDiff` applies the model's V4A diff to the file as the API reads it, and the API writes the
 * result (confined to /workspace by the server). A patch that does not apply, a missing file or a
 * path outside /workspace is answered to the model as a `failed` call with the reason.
 */
export class CairnEditor implements Editor {
  constructor(
    private readonly session: { readonly files: Files },
    private readonly options: CairnEditorOptions = {},
  ) {}

  createFile(operation: Operation<'create_file'>): Promise<ApplyPatchResult> {
    return this.attempt(operation.path, async () => {
      const file = this.resolve(operation.path)
      if (await this.exists(file)) throw new EditRefused(`${operation.path} already exists`)
      await this.session.files.write(file, patched(operation.path, '', operation.diff, 'create'))
      return `created ${operation.path}`
    })
  }

  updateFile(operation: Operation<'update_file'>): Promise<ApplyPatchResult> {
    return this.attempt(operation.path, async () => {
      const file = this.resolve(operation.path)
      const target = operation.moveTo ? this.resolve(operation.moveTo) : file
      const current = await this.session.files.readText(file)
      await this.session.files.write(target, patched(operation.path, current, operation.diff, 'default'))
      if (target === file) return `updated ${operation.path}`
      await this.session.files.delete(file)
      return `moved ${operation.path} to ${operation.moveTo}`
    })
  }

  deleteFile(operation: Operation<'delete_file'>): Promise<ApplyPatchResult> {
    return this.attempt(operation.path, async () => {
      await this.session.files.delete(this.resolve(operation.path))
      return `deleted ${operation.path}`
    })
  }

  /**
   * The path for the files API (relative to /workspace). An absolute path must be in /workspace:
   * the API would take `/etc/passwd` as `/workspace/etc/passwd`, which is not what the model meant.
   * `..` is left to the server, which refuses a path that leaves the workspace.
   */
  private resolve(path: string): string {
    if (path.startsWith('/')) {
      if (path === '/workspace' || path.startsWith('/workspace/')) return path.slice('/workspace/'.length)
      throw new EditRefused(`${path} is outside the workspace: paths are relative to /workspace or under it`)
    }
    return this.options.cwd ? `${this.options.cwd}/${path}` : path
  }

  private async exists(file: string): Promise<boolean> {
    const slash = file.lastIndexOf('/')
    const dir = slash < 0 ? '' : file.slice(0, slash)
    try {
      return (await this.session.files.list(dir)).some((entry) => entry.name === file.slice(slash + 1))
    } catch (error) {
      if (error instanceof CairnError && error.code === 'not_found') return false
      throw error
    }
  }

  /** Runs an edit: its note on success, `failed` with the reason when the model's edit was at fault. */
  private async attempt(path: string, edit: () => Promise<string>): Promise<ApplyPatchResult> {
    try {
      return { status: 'completed', output: await edit() }
    } catch (error) {
      if (error instanceof EditRefused) return { status: 'failed', output: error.message }
      if (error instanceof CairnError && MODEL_FAULT_CODES.has(error.code))
        return { status: 'failed', output: `${path}: ${error.message} (${error.code})` }
      throw error
    }
  }
}

/** The file's text after the diff, or `EditRefused` saying why the diff does not apply. */
function patched(path: string, current: string, diff: string, mode: 'default' | 'create'): string {
  try {
    return applyDiff(current, diff, mode)
  } catch (error) {
    throw new EditRefused(`the patch does not apply to ${path}: ${(error as Error).message}`)
  }
}
