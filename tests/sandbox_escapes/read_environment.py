"""Read the parent's environment: our own, and every /proc/*/environ visible (and the
pids given on stdin). Other processes' environments are searched for the marker given
on stdin, never printed."""

import json
import os
import sys

params = json.loads(sys.stdin.read() or "{}")
marker = params.get("marker", "").encode()
print("own:", dict(os.environ), flush=True)
visible = sorted(p for p in os.listdir("/proc") if p.isdigit())
for pid in dict.fromkeys(["1", str(os.getppid()), *map(str, params.get("pids", [])), *visible]):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            found = bool(marker) and marker in f.read()
        print(f"OPENED /proc/{pid}/environ" + (": FOUND the marker" if found else ""), flush=True)
    except OSError as exc:
        print(f"blocked /proc/{pid}/environ: {exc!r}", flush=True)
