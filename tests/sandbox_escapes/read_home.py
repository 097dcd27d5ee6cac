"""Read secrets from the home directories (paths on stdin), list them, and read the
password hashes. What is read is searched for the marker given on stdin, never printed."""

import json
import os
import sys

params = json.load(sys.stdin)
paths, marker = params["paths"], params.get("marker", "")
for path in [*paths, "/etc/shadow", "/etc/gshadow", os.path.expanduser("~/.bash_history")]:
    try:
        with open(path) as f:
            text = f.read()
        found = ": FOUND the marker" if marker and marker in text else ""
        print(f"OPENED {path} ({len(text)} characters){found}", flush=True)
    except OSError as exc:
        print(f"blocked {path}: {exc!r}", flush=True)
for directory in {os.path.dirname(p) for p in paths} | {"/root", "/home", os.path.expanduser("~")}:
    try:
        print(f"listed {directory}: {len(os.listdir(directory))} entries", flush=True)
    except OSError as exc:
        print(f"blocked listing {directory}: {exc!r}", flush=True)
