"""Cairn stdio shim: marks the end of a turn exactly when the agent asks for its next input line.

Injected through PYTHONPATH by the runtime; a plain input()/print() loop needs no Cairn import.
"""
import builtins
import os
import sys

_MARK = os.environ.get("CAIRN_STDIO_MARK")


def _install():
    real_stdin = sys.stdin
    real_stdout = sys.__stdout__
    state = {"lines": 0}

    def ask():
        try:
            sys.stdout.flush()
        except Exception:
            pass
        real_stdout.write("\x1e%s:%d\x1f" % (_MARK, state["lines"]))
        real_stdout.flush()

    def read_line():
        ask()
        line = real_stdin.readline()
        if line:
            state["lines"] += 1
        return line

    def cairn_input(prompt=None):
        # The prompt is not echoed: it is not part of the agent's reply.
        line = read_line()
        if not line:
            raise EOFError
        return line[:-1] if line.endswith("\n") else line

    class StdinProxy:
        def __init__(self, inner):
            self._inner = inner

        def readline(self, *args):
            return read_line()

        def __iter__(self):
            return self

        def __next__(self):
            line = read_line()
            if not line:
                raise StopIteration
            return line

        def __getattr__(self, name):
            return getattr(self._inner, name)

    builtins.input = cairn_input
    sys.stdin = StdioProxy = StdinProxy(real_stdin)  # noqa: F841


if _MARK and os.environ.get("CAIRN_PROTOCOL") == "stdio":
    _install()
