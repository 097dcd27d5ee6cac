"""Many children, each holding less than the per-process limit, together far more:
each allocates (and touches) ``mb`` MB, reports, and holds it until the parent is done.
Prints how many held their share at once (reported and still alive), and each death."""

import json
import os
import select
import sys
import time

params = json.load(sys.stdin)
n, mb = params["children"], params["mb"]
read, write = os.pipe()
children = set()
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        os.close(read)
        block = bytearray(mb << 20)
        block[::4096] = b"x" * len(block[::4096])
        os.write(write, f"{os.getpid()}\n".encode())
        time.sleep(60)
        os._exit(0)
    children.add(pid)
os.close(write)
reported, dead, text = set(), set(), b""
deadline = time.monotonic() + 30
while reported | dead != children and time.monotonic() < deadline:
    if select.select([read], [], [], 0.2)[0]:
        text += os.read(read, 4096)
        *done, text = text.split(b"\n")
        reported |= {int(pid) for pid in done}
    for pid in children - dead:
        ended, status = os.waitpid(pid, os.WNOHANG)
        if ended:
            dead.add(pid)
            how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else "exit"
            print(f"a child ended: {how}", flush=True)
held = len(reported - dead)
print(f"held at once {held} of {n}", flush=True)
if held == n:
    print(f"ESCAPED: {n} children held {n * mb} MB together", flush=True)
