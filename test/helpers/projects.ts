import { writeFile } from 'node:fs/promises'
import path from 'node:path'
import { scratchDir } from './scratch.js'

/** Writes a throwaway agent project (files by relative path) and returns its directory. */
export async function makeProject(files: Record<string, string>): Promise<string> {
  const dir = await scratchDir('cairn-project-')
  for (const [name, body] of Object.entries(files)) {
    await writeFile(path.join(dir, name), body)
  }
  return dir
}

/**
 * An agent that appends each line to log.txt and answers `kept <every line so far>`, so a reply
 * shows which turns the workspace holds.
 */
export const KEEPER_PROJECT: Record<string, string> = {
  'cairn.yaml': 'name: keeper\ncommand: python3 keeper.py\n',
  'keeper.py': [
    'while True:',
    '    line = input()',
    '    open("log.txt", "a").write(line + "\\n")',
    '    print("kept", " ".join(open("log.txt").read().split()))',
  ].join('\n'),
}

/**
 * A jsonl agent that asks for approval (human review): `ask …` writes review.txt and asks to
 * delete build/; an answer is said back as `got <id> <decision> <note>`; anything else is echoed.
 */
export const REVIEWER_PROJECT: Record<string, string> = {
  'cairn.yaml': 'name: reviewed\ncommand: python3 agent.py\nprotocol: jsonl\n',
  'agent.py': `import json, sys
def say(frame):
    sys.stdout.write(json.dumps(frame) + "\\n")
    sys.stdout.flush()
for line in sys.stdin:
    m = json.loads(line)
    a = m.get("approval")
    if a:
        say({"type": "text", "content": "got %s %s %s" % (a["id"], a["decision"], a["note"])})
    elif m["content"].startswith("ask"):
        open("review.txt", "w").write(m["content"])
        say({"type": "approval.request", "summary": "delete build/", "action": {"run": "rm -rf build"}})
    else:
        say({"type": "text", "content": "echo " + m["content"]})
    say({"type": "turn.done"})
`,
}

/** An agent that runs each line as a bash command and answers its output and `[exit <status>]`. */
export const SHELL_AGENT =
  'while IFS= read -r line; do bash -c "$line" </dev/null 2>&1; echo "[exit $?]"; done\n'

/** The `shell` agent project (see SHELL_AGENT). */
export const SHELL_PROJECT: Record<string, string> = {
  'cairn.yaml': 'name: shell\ncommand: bash agent.sh\n',
  'agent.sh': SHELL_AGENT,
}

/** An exec agent project on the OCI image `image` (its `/agent.sh`, run by `/bin/sh`): its directory. */
export function ociAgent(name: string, image: string): Promise<string> {
  return makeProject({
    'cairn.yaml': `name: ${name}\ncommand: [/bin/sh, /agent.sh]\nprotocol: exec\nimage: ${image}\n`,
  })
}
