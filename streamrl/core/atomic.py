"""Replacing a file or directory atomically: build it next to its place, flush it to disk,
rename it there. Every command that writes an output goes through here.

    with replacing(path) as tmp:          # a file
        tmp.write_text(...)
    with replacing(path, directory=True) as tmp:   # a directory (a model, a dataset)
        model.save_pretrained(tmp)

On success ``path`` holds the new content (a directory replaces the old one, which is
removed only after the new one is in place); on any failure (a full disk, a writer that
raises) the temporary copy is removed, ``path`` is untouched, and :class:`WriteError`
(an ``OSError``: one line naming ``path`` and why) is raised. ``distinct_paths`` refuses
an output that is the same file as an input or as another output, before anything runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TMP_PREFIX = ".tmp-"


class WriteError(OSError):
    """A file or directory could not be written; the message names it and says why."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "write failed"


def reason(e: BaseException) -> str:
    """One line for why a write failed: the OS's words for an OSError, else the text."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


def fsync_path(path: str | Path) -> None:
    """Flush a file or a directory entry list to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


fsync_dir = fsync_path


def fsync_tree(path: Path) -> None:
    """Flush every file under ``path`` (or the file itself) and the directories holding them."""
    if not path.is_dir():
        fsync_path(path)
        return
    for parent, _, files in os.walk(path):
        for name in files:
            fsync_path(os.path.join(parent, name))
        fsync_path(parent)


def _renameat2() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.renameat2
    except (OSError, AttributeError):
        return None


RENAME_EXCHANGE = 2
AT_FDCWD = -100


def swap_directories(a: Path, b: Path) -> None:
    """Exchange directories ``a`` and ``b`` in one step (Linux ``renameat2`` with
    ``RENAME_EXCHANGE``): a crash leaves each name holding a whole directory. Where that
    call is missing, three renames (a crash between them leaves ``b``'s old content
    under a temporary name next to it, nothing lost)."""
    fn = _renameat2()
    if fn is not None:
        res = fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE)
        if res == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), str(b))
    old = b.with_name(f"{TMP_PREFIX}old-{b.name}-{os.getpid()}")
    remove(old)
    b.rename(old)
    a.rename(b)
    old.rename(a)


def remove(path: Path) -> None:
    """Remove a file or directory if it exists (errors ignored: this is clean-up)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def temp_path(path: Path) -> Path:
    """A name next to ``path`` (same directory, so a rename is atomic), unique per process."""
    return path.with_name(f"{TMP_PREFIX}{os.getpid()}-{path.name}")  # keeps the suffix


@contextlib.contextmanager
def replacing(path: str | Path, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``path`` to write the new content to; on leaving, it
    is flushed and renamed over ``path``. See the module docstring."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove(tmp)  # a leftover of a killed process with the same pid
        if directory:
            tmp.mkdir()
        yield tmp
        if not tmp.exists():
            raise FileNotFoundError(f"the writer left nothing at {tmp}")
        fsync_tree(tmp)
        if directory and path.exists():
            swap_directories(tmp, path)
            remove(tmp)  # now the old content
        else:
            tmp.replace(path)
        fsync_dir(path.parent)
    except BaseException as e:
        remove(tmp)
        if isinstance(e, Exception) and not isinstance(e, WriteError):
            raise WriteError(f"cannot write {path}: {reason(e)}") from e
        raise


def write_text(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically."""
    with replacing(path) as tmp:
        tmp.write_text(text)


def distinct_paths(inputs: dict[str, str | Path | None], outputs: dict[str, str | Path | None]):
    """Refuse (``ValueError``, one line) an output that is the same file as an input or as
    another output: writing it would destroy what is read, or one output the other."""
    seen: list[tuple[str, Path]] = []
    for role, given in inputs.items():
        if given is not None:
            seen.append((role, Path(given).expanduser().resolve()))
    for role, given in outputs.items():
        if given is None:
            continue
        path = Path(given).expanduser().resolve()
        for other_role, other in seen:
            if path == other or (path.exists() and other.exists() and path.samefile(other)):
                raise ValueError(
                    f"{role} {given} is the same file as {other_role}: give a different path"
                )
        seen.append((role, path))
