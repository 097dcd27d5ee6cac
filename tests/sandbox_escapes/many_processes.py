"""Start sleeping children until a fork is refused; prints how many ran at once."""

import os
import time

count = 0
while count < 10_000:
    try:
        pid = os.fork()
    except OSError as exc:
        print(f"refused after {count}: {exc!r}", flush=True)
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    count += 1
print(f"children {count}", flush=True)
