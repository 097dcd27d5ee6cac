"""Hold memory where RLIMIT_AS does not look: pages written into memfds (POSIX shared
memory and tmpfs files are the same pages) are never mapped by the writer. Each memfd
stays under the file size limit; there are as many as it takes."""

import os

chunk = b"x" * (8 << 20)
fds = []
for held in range(8, 4097, 8):
    fds.append(os.memfd_create("hoard"))
    os.write(fds[-1], chunk)
    print(f"holding {held} MB", flush=True)
print("ESCAPED: held 4 GB in memfds", flush=True)
