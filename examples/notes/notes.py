"""Notes agent: no Cairn import, just input() and print().

Statements are appended to /workspace/notes.md; a question (ending in '?') is answered with the
noted lines that share a word with it. The file lives in the session's workspace, so it survives
turns, sandbox restarts and server restarts.
"""
import os
import re

NOTES = os.path.join(os.environ.get("CAIRN_WORKSPACE", "/workspace"), "notes.md")
STOP = {"a", "an", "the", "is", "are", "was", "what", "who", "where", "when", "which", "do", "does",
        "did", "i", "you", "my", "your", "of", "to", "in", "on", "at", "and", "or", "it", "me", "we"}


def words(text):
    return {w for w in re.findall(r"[a-z0-9']+", text.lower()) if w not in STOP}


def read_notes():
    if not os.path.exists(NOTES):
        return []
    with open(NOTES, encoding="utf-8") as f:
        return [line[2:].rstrip("\n") for line in f if line.startswith("- ")]


while True:
    try:
        line = input("> ").strip()
    except EOFError:
        break
    if not line:
        continue
    if line.endswith("?"):
        asked = words(line)
        hits = [note for note in read_notes() if asked & words(note)]
        if hits:
            print("From my notes:")
            for note in hits:
                print("- " + note)
        else:
            print("I have no note about that.")
    else:
        with open(NOTES, "a", encoding="utf-8") as f:
            f.write("- " + line + "\n")
        print("Noted: " + line)
