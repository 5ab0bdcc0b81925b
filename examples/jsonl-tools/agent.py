"""jsonl protocol example: frames in on stdin, frames out on stdout, one JSON object per line."""
import json
import os
import sys
import time


def send(frame):
    sys.stdout.write(json.dumps(frame) + "\n")
    sys.stdout.flush()


send({"type": "ready"})
for raw in sys.stdin:
    frame = json.loads(raw)
    if frame.get("type") != "message":
        continue
    send({"type": "status", "message": "thinking"})
    started = time.time()
    send({"type": "tool.start", "id": "t1", "name": "list_files", "input": {"path": "/workspace"}})
    files = sorted(os.listdir("/workspace"))
    send({"type": "tool.end", "id": "t1", "output": files})
    send({"type": "text", "content": "You said: %s\n" % frame["content"]})
    send({"type": "text", "content": "Workspace has %d entries (%.1f ms)." % (len(files), (time.time() - started) * 1000)})
    send({"type": "turn.done"})
