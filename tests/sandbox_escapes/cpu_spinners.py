"""Many children spinning the CPU for ``seconds`` of wall clock each; prints the
wall-clock seconds they spun, measured inside."""

import json
import os
import sys
import time

params = json.load(sys.stdin)
start = time.monotonic()
pids = []
for _ in range(params["children"]):
    pid = os.fork()
    if pid == 0:
        while time.monotonic() - start < params["seconds"]:
            pass
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
print(f"spun {time.monotonic() - start:.3f}", flush=True)
