"""Leave a daemon behind: double fork, new session, ignore SIGHUP, sleep (named from
stdin so that the test can look for it after the run)."""

import ctypes
import json
import os
import signal
import sys
import time

name = json.load(sys.stdin)["name"].encode()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        ctypes.CDLL(None).prctl(15, name, 0, 0, 0)  # PR_SET_NAME
        for fd in range(3):
            os.close(fd)
        time.sleep(120)
    os._exit(0)
print("left a daemon", flush=True)
