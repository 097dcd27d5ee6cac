"""Hold memory in TCP socket buffers (cgroup v1's memory counter does not see them):
connect to a listener of our own on the sandbox's loopback, many times, and send
without reading. Prints the megabytes queued."""

import socket

listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(512)
chunk = b"x" * (1 << 20)
held, queued = [], 0
for _ in range(200):
    try:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    except OSError as exc:
        print(f"refused: {exc!r}", flush=True)
        break
    client.setblocking(False)
    while True:
        try:
            queued += client.send(chunk)
        except (BlockingIOError, OSError):
            break
    held.append((client, server))
print(f"queued {queued >> 20} MB in {len(held)} connections", flush=True)
