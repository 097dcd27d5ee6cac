"""Reading back the files a run wrote (``summary.json``, ``meta.json``, ``metrics.jsonl``,
``ledger.jsonl``, ...): damage of any kind (random bytes, an empty or truncated file, a
row or field missing) is one line naming the file, the line and the field, as
:class:`UnreadableFile` (a ``ValueError``, which the command line prints without a
traceback)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class UnreadableFile(ValueError):
    """A file the run reads back is damaged; the message names it (and the line)."""


def _text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UnreadableFile(f"{path}: cannot read it ({e.strerror or e})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise UnreadableFile(f"{path}:{line}: not UTF-8 text (byte {e.start})") from None


NAMES = {int: "an integer", float: "a number", str: "a string", dict: "an object", list: "a list"}


def _type_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(NAMES.get(k, k.__name__) for k in kinds)


def check_fields(row: Any, required: dict[str, Any], where: str) -> dict[str, Any]:
    """``row`` must be a JSON object whose ``required`` fields have the given types."""
    if not isinstance(row, dict):
        raise UnreadableFile(f"{where}: expected a JSON object, got {type(row).__name__}")
    for key, kind in required.items():
        if key not in row:
            raise UnreadableFile(f"{where}: no {key!r} field")
        value = row[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
            raise UnreadableFile(f"{where}: {key!r} is {value!r}, expected {_type_name(kind)}")
    return row


def read_json(path: str | Path, required: dict[str, Any] | None = None) -> dict[str, Any]:
    """A JSON object from ``path`` with ``required`` fields ({name: type})."""
    path = Path(path)
    text = _text(path)
    if not text.strip():
        raise UnreadableFile(f"{path}: empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UnreadableFile(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    return check_fields(data, required or {}, str(path))


def read_jsonl(path: str | Path, required: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The rows of a JSONL file ([] if it does not exist), each a JSON object with the
    ``required`` fields. A torn last line (a process killed in the middle of writing it:
    no newline at its end) is left out; a damaged line anywhere else is an error."""
    path = Path(path)
    if not path.exists():
        return []
    text = _text(path)
    lines = text.split("\n")  # the last element is "" when the file ends with a newline
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines):  # torn: the writer was killed mid-line
                break
            raise UnreadableFile(f"{path}:{number}: not valid JSON ({e.msg})") from None
        rows.append(check_fields(row, required or {}, f"{path}:{number}"))
    return rows


#: the fields every row of a step-indexed log (metrics.jsonl, ledger.jsonl) has
STEP_ROW = {"step": int}
