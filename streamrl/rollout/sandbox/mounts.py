"""The strong sandbox's filesystem and environment: what the code sees.

Everything read-only (``--ro-bind / /``), fresh /dev and /proc, /root, /home, $HOME,
/run and /var/tmp under empty tmpfs (the Python installation bound back read-only),
/tmp replaced by one private size-capped tmpfs at /tmp/work holding main.py, the
password hash files masked, and a cleared environment.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import sys
from pathlib import Path
from typing import Any

WORKDIR = "/tmp/work"  # the private directory, as the code sees it
# plus /tmp and the user's home; /run for its sockets (D-Bus, docker, ssh-agent): a
# read-only mount still lets one connect to a socket, and the network namespace does not
# cover sockets that live in the filesystem
HIDDEN = ("/root", "/home", "/run", "/var/tmp")
MASKED = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def sandbox_env(home: str) -> dict[str, str]:
    """The code's whole environment; the interpreter's directory leads PATH."""
    return {
        "PATH": f"{os.path.dirname(sys.executable)}:{SYSTEM_PATH}",
        "HOME": home,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def hidden_dirs(home: str | None) -> list[str]:
    """Directories replaced by an empty tmpfs: HIDDEN, $HOME and the account's home
    (/tmp is handled with the private directory; a directory inside another goes)."""
    homes = [home]
    with contextlib.suppress(KeyError):
        homes.append(pwd.getpwuid(os.geteuid()).pw_dir)
    found = {os.path.realpath(d) for d in [*HIDDEN, *homes] if d and os.path.isdir(d)}
    found -= {"/", "/proc", "/dev", "/sys", "/usr", "/etc"}
    found = {d for d in found if not is_under(d, "/tmp")}
    return sorted(d for d in found if not any(o != d and is_under(d, o) for o in found))


def keep_paths() -> list[str]:
    """The Python installation (and venv), bound back where a hidden directory covers it."""
    paths = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix)}
    paths |= {os.path.abspath(p) for p in (sys.base_prefix, sys.prefix)}
    return sorted(p for p in paths if not any(o != p and is_under(p, o) for o in paths))


def filesystem_args(hidden: list[str], code_fd: int, workdir_bytes: int) -> list[str]:
    """bwrap mounts: everything read-only, fresh /dev and /proc, ``hidden`` and /tmp
    under empty tmpfs, the private tmpfs with main.py (from ``code_fd``), masks."""
    args = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    keep = keep_paths()
    for directory in hidden:
        args += hide_args(directory, keep)
    workdir = ["--perms", "0777", "--size", str(workdir_bytes), "--tmpfs", WORKDIR]
    workdir += ["--perms", "0644", "--file", str(code_fd), f"{WORKDIR}/main.py"]
    args += hide_args("/tmp", keep, inside=workdir)
    # /dev's own tmpfs read-only; /dev/shm a private tmpfs as small as the work directory
    # (POSIX semaphores and shared memory: multiprocessing needs it)
    args += ["--perms", "01777", "--size", str(workdir_bytes), "--tmpfs", "/dev/shm"]
    args += ["--remount-ro", "/dev"]
    for path in MASKED:  # no-one's password hashes, whatever uid the code runs as
        if os.path.isfile(path):
            args += ["--ro-bind", "/dev/null", path]
    return args


def hide_args(directory: str, keep: list[str], inside: list[str] = ()) -> list[str]:
    """bwrap arguments: an empty tmpfs on ``directory``, ``keep`` paths under it bound
    back read-only, then ``inside`` (more mounts), then the tmpfs made read-only."""
    args = ["--tmpfs", directory]
    for path in keep:
        if path != directory and is_under(path, directory):
            parent = directory  # bwrap would make missing parents 0700: unreadable to uid 65534
            for part in Path(path).relative_to(directory).parts[:-1]:
                parent = os.path.join(parent, part)
                args += ["--perms", "0755", "--dir", parent]
            args += ["--ro-bind", path, path]
    return [*args, *inside, "--remount-ro", directory]


def is_under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def remove_tree(path: str) -> None:
    """rmtree that also removes what the code made unreadable (chmod 000 directories)."""

    def retry(func: Any, failed: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), 0o700)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, 0o700)
        with contextlib.suppress(OSError):
            func(failed)

    shutil.rmtree(path, onerror=retry)
