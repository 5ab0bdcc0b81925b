"""Cairn agent kit for the ``jsonl`` protocol (Python, standard library only).

Present in every sandbox at /opt/cairn/python, which the runtime puts on PYTHONPATH for ``jsonl``
and ``exec`` agents, so ``import cairn_agent`` needs no installation::

    from cairn_agent import tool, turns

    for turn in turns():
        turn.status("thinking")
        with tool("list_files", {"path": "."}) as call:
            call.output = sorted(os.listdir("."))
        turn.write("You said: " + turn.content)
        # turn.done() is sent for you when the loop moves on to the next message.

Frames go to the process's real stdout. Once ``turns()`` starts, ``print()`` and anything else
written to file descriptor 1 go to stderr instead (the session's log), so a stray print cannot
break the protocol.
"""

import functools
import inspect
import json
import os
import sys

__all__ = ["Turn", "ToolCall", "tool", "turns", "transcript"]

_out = None  # the frame channel (the original stdout), opened by _channel()
_current = None  # the Turn being answered, if any


def _channel():
    """Takes file descriptor 1 for frames and points fd 1 and sys.stdout at stderr."""
    global _out
    if _out is None:
        try:
            sys.stdout.flush()
        except Exception:
            pass
        fd = os.dup(1)
        os.dup2(2, 1)
        _out = os.fdopen(fd, "w", encoding="utf-8", buffering=1)
        sys.stdout = sys.stderr
    return _out


def _send(frame):
    out = _channel()
    out.write(json.dumps(frame, default=_fallback) + "\n")
    out.flush()


def _fallback(value):
    """JSON for values json cannot encode natively (sets, bytes, objects): a close readable form."""
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return repr(value)


def transcript():
    """The session's turns before the current one: a list of dicts with role, turn and content."""
    path = os.environ.get("CAIRN_TRANSCRIPT")
    if not path:
        return []
    try:
        with open(path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


class Turn:
    """One user message and the means to answer it. Frames sent after done() or error() raise."""

    def __init__(self, content, turn, turn_id):
        self.content = content
        self.turn = turn
        self.turn_id = turn_id
        self.finished = False
        self._tools = 0

    def __repr__(self):
        return "Turn(turn=%r, turn_id=%r, content=%r)" % (self.turn, self.turn_id, self.content)

    def _emit(self, frame):
        if self.finished:
            raise RuntimeError("turn %s is already finished" % self.turn)
        _send(frame)

    def transcript(self):
        """Earlier turns of the session (user and assistant messages), oldest first."""
        return transcript()

    def write(self, text):
        """Streams text of the reply."""
        text = str(text)
        if text:
            self._emit({"type": "text", "content": text})

    def status(self, message):
        """A progress line shown to the user (not part of the reply)."""
        self._emit({"type": "status", "message": str(message)})

    def tool_start(self, name, input=None):
        """Reports the start of a tool call; returns its id for tool_end()."""
        self._tools += 1
        call_id = "%s_%d" % (self.turn_id or "t%s" % self.turn, self._tools)
        frame = {"type": "tool.start", "id": call_id, "name": str(name)}
        if input is not None:
            frame["input"] = input
        self._emit(frame)
        return call_id

    def tool_end(self, call_id, output=None, is_error=False):
        """Reports the end of a tool call started with tool_start()."""
        frame = {"type": "tool.end", "id": call_id}
        if output is not None:
            frame["output"] = output
        if is_error:
            frame["isError"] = True
        self._emit(frame)

    def tool(self, name, input=None):
        """A tool call on this turn, as a context manager or decorator (see ``tool``)."""
        return tool(name, input, turn=self)

    def metadata(self, data):
        """Free-form metadata for this turn (a dict, e.g. token usage or the model used)."""
        self._emit({"type": "metadata", "data": dict(data)})

    def done(self):
        """Ends the turn. Called for you when the ``turns()`` loop moves on; a second call is a no-op."""
        if not self.finished:
            _send({"type": "turn.done"})
            self.finished = True

    def error(self, message):
        """Ends the turn as failed with this message; the agent keeps running for the next turn."""
        if not self.finished:
            _send({"type": "error", "message": str(message)})
            self.finished = True


def turns():
    """Yields one Turn per user message, for the life of the process. Sends ``ready`` first."""
    global _current
    _channel()
    _send({"type": "ready"})
    # Frames are UTF-8 whatever the sandbox's locale says.
    stdin = getattr(sys.stdin, "buffer", sys.stdin)
    while True:
        raw = stdin.readline()
        if not raw:
            return
        if isinstance(raw, bytes):
            raw = raw.decode("utf-8", "replace")
        raw = raw.strip()
        if not raw:
            continue
        try:
            frame = json.loads(raw)
        except ValueError:
            sys.stderr.write("cairn_agent: ignoring a line that is not JSON: %r\n" % raw[:200])
            continue
        if not isinstance(frame, dict) or frame.get("type") != "message":
            continue
        current = Turn(frame.get("content", ""), frame.get("turn", 0), frame.get("turnId", ""))
        _current = current
        try:
            yield current
        finally:
            _current = None
        current.done()


class ToolCall:
    """A running tool call: set ``output`` to report the result (a ``with`` block's value)."""

    def __init__(self, turn, name, input):
        self.turn = turn
        self.name = name
        self.input = input
        self.output = None
        self.id = None


class tool:
    """Reports a tool call around a block or a function: tool.start, then tool.end with its output.

    As a context manager, set ``call.output``; as a decorator, the return value is the output and
    the call's arguments are the input. An exception ends the call with ``isError`` and the
    exception's text as output, and is raised again::

        with tool("search", {"q": q}) as call:
            call.output = search(q)

        @tool("add")          # or @tool, named after the function
        def add(a, b):
            return a + b
    """

    def __init__(self, name=None, input=None, turn=None):
        self._fn = None
        if callable(name):
            self._fn, name = name, getattr(name, "__name__", "tool")
        self.name = name
        self.input = input
        self._turn = turn
        self._calls = []
        if self._fn is not None:
            functools.update_wrapper(self, self._fn)

    def _resolve_turn(self):
        turn = self._turn or _current
        if turn is None:
            raise RuntimeError("cairn_agent.tool used outside a turn")
        return turn

    def __enter__(self):
        turn = self._resolve_turn()
        call = ToolCall(turn, self.name or "tool", self.input)
        call.id = turn.tool_start(call.name, call.input)
        self._calls.append(call)
        return call

    def __exit__(self, exc_type, exc, tb):
        call = self._calls.pop()
        if exc_type is None:
            call.turn.tool_end(call.id, call.output)
        else:
            call.turn.tool_end(call.id, "%s: %s" % (exc_type.__name__, exc), is_error=True)
        return False

    def __call__(self, *args, **kwargs):
        if self._fn is None:
            # @tool("name") / @tool(): wrap the function.
            if len(args) != 1 or kwargs or not callable(args[0]):
                raise TypeError("tool(name) decorates a single function")
            fn = args[0]
            return tool(self.name or getattr(fn, "__name__", "tool"), turn=self._turn)._wrap(fn)
        return self._invoke(self._fn, args, kwargs)

    def __get__(self, obj, objtype=None):
        # A decorated method: bind it like a function would be.
        if obj is None or self._fn is None:
            return self
        return functools.partial(self.__call__, obj)

    def _wrap(self, fn):
        self._fn = fn
        functools.update_wrapper(self, fn)
        return self

    def _invoke(self, fn, args, kwargs):
        try:
            bound = inspect.signature(fn).bind(*args, **kwargs)
            call_input = dict(bound.arguments)
            call_input.pop("self", None)  # a decorated method: its object is not the input
        except (TypeError, ValueError):
            call_input = {"args": list(args), "kwargs": kwargs}
        with tool(self.name, call_input, turn=self._turn) as call:
            call.output = fn(*args, **kwargs)
        return call.output
