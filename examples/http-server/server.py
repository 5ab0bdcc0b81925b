"""An agent that serves HTTP: each message is a POST of {"prompt", "sessionId", "turn", "turnId"}.

The answer streams as Server-Sent Events whose data are Cairn's agent frames (status, text,
tool.start/tool.end, turn.done). An agent may instead answer text/plain (streamed as it is
written) or application/json ({"response": "..."}). Only the standard library is used.
"""

import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NOTES = "/workspace/notes.txt"


class Agent(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        if self.path != "/run":
            self.send_error(404)
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["prompt"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.send_frame({"type": "status", "message": "thinking"})
        if prompt.startswith("remember "):
            self.send_frame({"type": "tool.start", "id": "w1", "name": "write_notes", "input": {"path": NOTES}})
            with open(NOTES, "a") as notes:
                notes.write(prompt[len("remember ") :] + "\n")
            self.send_frame({"type": "tool.end", "id": "w1", "output": "saved"})
            reply = "noted"
        elif prompt == "recall":
            reply = open(NOTES).read().strip() if os.path.exists(NOTES) else "nothing yet"
        else:
            reply = "you said: " + prompt
        for i, word in enumerate(reply.split(" ")):
            self.send_frame({"type": "text", "content": word if i == 0 else " " + word})
        self.send_frame({"type": "turn.done"})

    def send_frame(self, frame):
        self.wfile.write(("data: " + json.dumps(frame) + "\n\n").encode())
        self.wfile.flush()


ThreadingHTTPServer(("127.0.0.1", int(os.environ.get("PORT", "8000"))), Agent).serve_forever()
