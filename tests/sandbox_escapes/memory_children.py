"""Many children, each holding less than the per-process limit, together far more:
each allocates (and touches) ``mb`` MB, reports, and holds it until the parent is done.
Prints how many held their share at once, and how many were killed."""

import json
import os
import select
import sys
import time

params = json.load(sys.stdin)
n, mb = params["children"], params["mb"]
read, write = os.pipe()
pids = []
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        os.close(read)
        block = bytearray(mb << 20)
        block[::4096] = b"x" * len(block[::4096])
        os.write(write, b"1")
        time.sleep(60)
        os._exit(0)
    pids.append(pid)
os.close(write)
held, gone = 0, 0
deadline = time.monotonic() + 30
while held + gone < n and time.monotonic() < deadline:
    if select.select([read], [], [], 0.2)[0]:
        held += len(os.read(read, n))
        print(f"children holding {mb} MB each: {held}", flush=True)
    for pid in list(pids):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            pids.remove(pid)
            gone += 1
            print(
                f"a child ended: {'signal ' + str(os.WTERMSIG(status)) if os.WIFSIGNALED(status) else 'exit'}",
                flush=True,
            )
print(f"held at once {held} of {n}", flush=True)
if held == n:
    print(f"ESCAPED: {n} children held {n * mb} MB together", flush=True)
