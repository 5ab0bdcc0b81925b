/** A jsonl agent for the console tests: each message is a bash command, reported as a `bash` tool call. */
export const SHELL_AGENT = {
  'cairn.yaml': 'name: console-demo\ncommand: python3 agent.py\nprotocol: jsonl\nsecrets: [DEMO_TOKEN]\n',
  'agent.py': `import json, subprocess, sys, time


def send(frame):
    sys.stdout.write(json.dumps(frame) + "\\n")
    sys.stdout.flush()


send({"type": "ready"})
for raw in sys.stdin:
    frame = json.loads(raw)
    if frame.get("type") != "message":
        continue
    command = frame["content"]
    tool = "t%d" % frame["turn"]
    send({"type": "status", "message": "running a shell command"})
    send({"type": "tool.start", "id": tool, "name": "bash", "input": {"command": command}})
    done = subprocess.run(["bash", "-c", command], cwd="/workspace", capture_output=True, text=True)
    output = done.stdout + done.stderr
    send({"type": "tool.end", "id": tool, "output": output, "isError": done.returncode != 0})
    for line in output.splitlines(True):
        send({"type": "text", "content": line})
        time.sleep(0.2)
    send({"type": "text", "content": "[exit %d]" % done.returncode})
    send({"type": "turn.done"})
`,
  // Draws a small PNG (a cairn: stacked stones) with the standard library only.
  'make_logo.py': `import struct, sys, zlib

W, H = 96, 96
stones = [(48, 78, 30, 10), (48, 58, 22, 9), (48, 41, 15, 7), (48, 28, 9, 5)]
rows = []
for y in range(H):
    row = bytearray([0])
    for x in range(W):
        pixel = (235, 241, 250)
        for cx, cy, rx, ry in stones:
            if ((x - cx) / rx) ** 2 + ((y - cy) / ry) ** 2 <= 1:
                shade = 90 + (y * 2) % 40
                pixel = (shade, shade + 10, shade + 30)
        row += bytes(pixel)
    rows.append(bytes(row))


def chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


png = b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0))
png += chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b"")
with open(sys.argv[1], "wb") as f:
    f.write(png)
`,
}
