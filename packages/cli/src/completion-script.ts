/** A command as completion sees it: its name, what it does, its options and its subcommands. */
export interface CompletionNode {
  name: string
  description: string
  options: string[]
  commands: CompletionNode[]
}

/** Commands whose argument is a session ID: completed from `cairn sessions list --json`. */
const SESSION_ARG = new Set([
  'sessions:snapshot',
  'sessions:snapshots',
  'sessions:restore',
  'sessions:undo',
  'sessions:fork',
  'sessions:files',
  'sessions:cat',
  'sessions:diff',
  'sessions:export',
  'sessions:get',
  'sessions:resume',
  'sessions:end',
  'sessions:delete',
  'sessions:messages',
  'sessions:events',
  'sessions:lease',
  'sessions:watch',
])
const SESSION_IDS = `cairn sessions list --json --limit 100 2>/dev/null | grep -o '"id":"ses_[a-z0-9]*"' | cut -d'"' -f4`

const words = (items: string[]) => items.join(' ')

export function bashCompletion(root: CompletionNode): string {
  const cases: string[] = [
    `    ":") opts="${words([...root.commands.map((c) => c.name), ...root.options])}" ;;`,
  ]
  for (const cmd of root.commands) {
    if (cmd.commands.length > 0) {
      cases.push(`    "${cmd.name}:") opts="${words([...cmd.commands.map((c) => c.name), '--help'])}" ;;`)
      for (const sub of cmd.commands) {
        const ids = SESSION_ARG.has(`${cmd.name}:${sub.name}`) ? ` $([[ $cur == -* ]] || ${SESSION_IDS})` : ''
        const opts = [...sub.commands.map((c) => c.name), ...sub.options]
        cases.push(`    "${cmd.name}:${sub.name}") opts="${words(opts)}${ids}" ;;`)
      }
    } else {
      cases.push(`    "${cmd.name}:"*) opts="${words(cmd.options)}" ;;`)
    }
  }
  return `# bash completion for cairn. Install: cairn completion bash > /etc/bash_completion.d/cairn
# (or add \`source <(cairn completion bash)\` to ~/.bashrc)
_cairn() {
  local cur="\${COMP_WORDS[COMP_CWORD]}" cmd="" sub="" opts="" i w
  for ((i = 1; i < COMP_CWORD; i++)); do
    w="\${COMP_WORDS[i]}"
    [[ $w == -* ]] && continue
    if [[ -z $cmd ]]; then cmd=$w
    elif [[ -z $sub ]]; then sub=$w; break
    fi
  done
  case "$cmd:$sub" in
${cases.join('\n')}
  esac
  COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}
complete -o default -F _cairn cairn
`
}

const zshQuote = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`
const zshItem = (name: string, description: string) => zshQuote(`${name.replace(/:/g, '\\:')}:${description}`)

export function zshCompletion(root: CompletionNode): string {
  const list = (nodes: CompletionNode[]) => nodes.map((n) => zshItem(n.name, n.description)).join(' ')
  const cases: string[] = [
    `    ":") items=(${list(root.commands)}); _describe command items; compadd -- ${words(root.options)} ;;`,
  ]
  for (const cmd of root.commands) {
    if (cmd.commands.length > 0) {
      cases.push(`    "${cmd.name}:") items=(${list(cmd.commands)}); _describe command items ;;`)
      for (const sub of cmd.commands) {
        const ids = SESSION_ARG.has(`${cmd.name}:${sub.name}`)
          ? `; [[ $PREFIX == -* ]] || compadd -- $(${SESSION_IDS})`
          : ''
        const opts = [...sub.commands.map((c) => c.name), ...sub.options]
        cases.push(`    "${cmd.name}:${sub.name}") compadd -- ${words(opts)}${ids} ;;`)
      }
    } else {
      cases.push(`    "${cmd.name}:"*) compadd -- ${words(cmd.options)}; _files ;;`)
    }
  }
  return `#compdef cairn
# zsh completion for cairn. Install: cairn completion zsh > "\${fpath[1]}/_cairn"
# (or add \`source <(cairn completion zsh)\` to ~/.zshrc after compinit)
_cairn() {
  local cmd="" sub="" i w
  local -a items
  for ((i = 2; i < CURRENT; i++)); do
    w=\${words[i]}
    [[ $w == -* ]] && continue
    if [[ -z $cmd ]]; then cmd=$w
    elif [[ -z $sub ]]; then sub=$w; break
    fi
  done
  case "$cmd:$sub" in
${cases.join('\n')}
  esac
}
if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
  _cairn "$@"
else
  compdef _cairn cairn
fi
`
}
