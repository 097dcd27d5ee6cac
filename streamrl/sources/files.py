"""Task sources read from local files: JSONL, Parquet and Hugging Face ``datasets``.

Row schema (the same for every format; column names are configurable with
``prompt_key``, ``messages_key``, ``answer_key``, ``id_key``, ``metadata_key``):

=============  ====================================  =========================================
column         type                                  meaning
=============  ====================================  =========================================
``prompt``     str                                   plain-text prompt
``messages``   list of ``{"role", "content"}``       chat turns; role is one of system, user,
                                                     assistant, tool; content is a string
``answer``     str or number (stored as str)         reference answer (optional)
``id``         str or int (stored as str)            unique id (optional, default
                                                     ``<file name>:<line>``, or
                                                     ``<file name>:<row>`` for tables)
``metadata``   dict                                  free-form (optional)
``rubric``     list of ``{criterion, weight, name}``  the criteria ``rubric_judge`` scores
                                                     (optional; checked, see
                                                     :mod:`streamrl.sources.rubrics`)
any other      anything                              copied into ``metadata`` (an explicit
                                                     ``metadata`` key wins on a clash)
=============  ====================================  =========================================

Exactly one of ``prompt`` / ``messages`` must be set per row (a null counts as
unset). An ``answer`` that is given may not be empty (leave it out for an item without
a reference). Every row is validated when the source is built; the first bad row raises
a :class:`~streamrl.sources.base.DataError` naming the file, the line (JSONL, 1-based) or
row (tables, 0-based) and the field. Blank JSONL lines are skipped. Ids must be
unique.

What one row may cost is bounded: a row larger than ``max_row_bytes`` (default
8 MiB: its JSONL line, or its Arrow data in a table) or nested deeper than
``MAX_ROW_DEPTH`` levels is an error naming it, found before the row is turned into
Python objects (a JSONL line is read at most ``max_row_bytes`` + 2 bytes at a time).

Held-out split: pass ``eval_path`` (a separate file, same schema); training rows
whose prompt also appears in it are dropped. Otherwise ``heldout_fraction``
(default 0.05) of the rows are held out by a stable hash of the prompt content
(``prompt`` text or the JSON of ``messages``): the split does not move when rows
are added or reordered, and duplicate prompts always land on the same side, so
train and held-out never share a prompt. ``heldout_fraction=0`` trains on all rows;
``heldout_fraction=1`` makes the whole file an evaluation set.

Example JSONL::

    {"prompt": "12+34=", "answer": 46}
    {"id": "q2", "messages": [{"role": "user", "content": "Capital of France?"}], "answer": "Paris"}
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from streamrl.core.types import Item
from streamrl.sources.base import DataError, FiniteTaskSource, in_heldout
from streamrl.sources.rubrics import RUBRIC_KEY, RubricError, parse_rubric

ROLES = ("system", "user", "assistant", "tool")
DEFAULT_HELDOUT_FRACTION = 0.05
DEFAULT_MAX_ROW_BYTES = 8 << 20  # one row (a JSONL line, a table row's Arrow data)
MAX_ROW_DEPTH = 64  # nesting levels of one row's values (a row uses about 4)
TABLE_BATCH_ROWS = 64  # rows of a table turned into Python objects at a time

# (line, row, record): exactly one of line / row is set.
Record = tuple[int | None, int | None, Any]


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


class RowParser:
    """Validates one raw row (a dict) and turns it into an :class:`Item`."""

    def __init__(
        self,
        prompt_key: str = "prompt",
        messages_key: str = "messages",
        answer_key: str = "answer",
        id_key: str = "id",
        metadata_key: str = "metadata",
    ) -> None:
        self.prompt_key, self.messages_key, self.answer_key = prompt_key, messages_key, answer_key
        self.id_key, self.metadata_key = id_key, metadata_key

    def parse(self, raw: Any, source: str, line: int | None, row: int | None) -> Item:
        def fail(message: str, field: str | None = None) -> DataError:
            return DataError(source, message, line=line, row=row, field=field)

        if not isinstance(raw, dict):
            raise fail(f"expected a JSON object, got {_type_name(raw)}")
        pk, mk = self.prompt_key, self.messages_key
        prompt, messages = raw.get(pk), raw.get(mk)
        if prompt is None and messages is None:
            raise fail(f"missing prompt: set '{pk}' (a string) or '{mk}' (a list of turns)")
        if prompt is not None and messages is not None:
            raise fail(f"both '{pk}' and '{mk}' are set; give exactly one")
        if prompt is not None:
            if not isinstance(prompt, str):
                raise fail(f"expected a string, got {_type_name(prompt)}", pk)
            if not prompt.strip():
                raise fail("empty prompt", pk)
        else:
            messages = self._messages(messages, fail)

        answer = raw.get(self.answer_key)
        if answer is not None:
            if isinstance(answer, bool) or not isinstance(answer, str | int | float):
                raise fail(
                    f"expected a string or number, got {_type_name(answer)}", self.answer_key
                )
            if isinstance(answer, float) and not math.isfinite(answer):
                raise fail(f"expected a finite number, got {answer}", self.answer_key)
            answer = str(answer)
            if not answer.strip():
                raise fail(
                    "empty answer: give the reference answer, or leave the field out for an "
                    "item without one",
                    self.answer_key,
                )

        item_id = raw.get(self.id_key)
        if item_id is None:
            item_id = f"{Path(source).name}:{line if line is not None else row}"
        elif isinstance(item_id, bool) or not isinstance(item_id, str | int):
            raise fail(f"expected a string or integer, got {_type_name(item_id)}", self.id_key)
        item_id = str(item_id)

        meta = raw.get(self.metadata_key)
        if meta is not None and not isinstance(meta, dict):
            raise fail(f"expected an object/dict, got {_type_name(meta)}", self.metadata_key)
        known = {pk, mk, self.answer_key, self.id_key, self.metadata_key}
        metadata = {k: v for k, v in raw.items() if k not in known}
        metadata.update(meta or {})
        if RUBRIC_KEY in metadata:  # (a rubric-judged item: its criteria, checked here)
            try:
                metadata[RUBRIC_KEY] = parse_rubric(metadata[RUBRIC_KEY])
            except RubricError as e:
                raise fail(e.message, e.field) from None
        return Item(id=item_id, prompt=prompt, messages=messages, answer=answer, metadata=metadata)

    def _messages(self, messages: Any, fail: Any) -> list[dict[str, str]]:
        mk = self.messages_key
        if not isinstance(messages, list):
            raise fail(f"expected a list of messages, got {_type_name(messages)}", mk)
        if not messages:
            raise fail("empty list of messages", mk)
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict):
                raise fail(f"message {i}: expected an object, got {_type_name(msg)}", mk)
            role, content = msg.get("role"), msg.get("content")
            if role not in ROLES:
                raise fail(f"message {i}: role must be one of {', '.join(ROLES)}; got {role!r}", mk)
            if not isinstance(content, str):
                raise fail(f"message {i}: content must be a string, got {_type_name(content)}", mk)
        # Copy (and drop null keys that Parquet struct columns add for absent fields).
        return [{k: v for k, v in m.items() if v is not None} for m in messages]


def prompt_key_of(item: Item) -> str:
    """The content an item is split and de-duplicated on: prompt text or messages JSON."""
    if item.prompt is not None:
        return item.prompt
    return json.dumps(item.messages, sort_keys=True, ensure_ascii=False)


class _FileTaskSource(FiniteTaskSource):
    """Shared logic: read records, validate them, split train / held-out."""

    def __init__(
        self,
        path: str | Path,
        *,
        eval_path: str | Path | None = None,
        heldout_fraction: float | None = None,
        prompt_key: str = "prompt",
        messages_key: str = "messages",
        answer_key: str = "answer",
        id_key: str = "id",
        metadata_key: str = "metadata",
        max_row_bytes: int = DEFAULT_MAX_ROW_BYTES,
    ) -> None:
        if eval_path is not None and heldout_fraction:
            raise ValueError("give either eval_path or heldout_fraction, not both")
        fraction = DEFAULT_HELDOUT_FRACTION if heldout_fraction is None else heldout_fraction
        if not 0.0 <= fraction <= 1.0:  # 1.0: the whole file is an evaluation set
            raise ValueError(f"heldout_fraction must be in [0, 1], got {fraction}")
        if max_row_bytes < 1:
            raise ValueError(f"max_row_bytes must be >= 1, got {max_row_bytes}")
        self.max_row_bytes = max_row_bytes
        self.parser = RowParser(prompt_key, messages_key, answer_key, id_key, metadata_key)
        rows = self._load(str(path))
        if eval_path is not None:
            heldout = self._load(str(eval_path))
            seen = {prompt_key_of(it) for it in heldout}
            train = [it for it in rows if prompt_key_of(it) not in seen]
        else:
            heldout = [it for it in rows if in_heldout(prompt_key_of(it), fraction)]
            train = [it for it in rows if not in_heldout(prompt_key_of(it), fraction)]
        self.num_dropped_overlap = len(rows) - len(train) - (0 if eval_path else len(heldout))
        super().__init__(train, heldout, name=str(path))

    def _load(self, source: str) -> list[Item]:
        items: list[Item] = []
        first_seen: dict[str, str] = {}
        for line, row, raw in self._records(source):
            item = self.parser.parse(raw, source, line, row)
            where = f"line {line}" if line is not None else f"row {row}"
            if item.id in first_seen:
                raise DataError(
                    source,
                    f"duplicate id {item.id!r} (first at {first_seen[item.id]})",
                    line=line,
                    row=row,
                    field=self.parser.id_key,
                )
            first_seen[item.id] = where
            items.append(item)
        if not items:
            raise DataError(source, "no rows: the file is empty")
        return items

    def _records(self, source: str) -> Iterable[Record]:
        raise NotImplementedError


def _too_large(size: int, limit: int, at_least: bool = False) -> str:
    more = "at least " if at_least else ""
    return (
        f"the row takes {more}{size} bytes, more than max_row_bytes={limit} (a source "
        "option): split it, or raise the limit"
    )


def check_depth(record: Any, source: str, line: int | None, row: int | None) -> None:
    """A DataError when ``record`` nests deeper than MAX_ROW_DEPTH (walked without
    recursion, so the check itself cannot run out of stack)."""
    stack = [(record, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_ROW_DEPTH:
            raise DataError(
                source, f"nested more than {MAX_ROW_DEPTH} levels deep", line=line, row=row
            )
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


def jsonl_records(source: str, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> Iterator[Record]:
    """(line, None, record) for every non-blank line of a JSONL file; a line that is not
    UTF-8 or not JSON, or larger than ``max_row_bytes`` or nested deeper than
    MAX_ROW_DEPTH, is a :class:`DataError` naming it (a line is never read whole
    beyond ``max_row_bytes``)."""
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"JSONL file not found: {source}")
    with path.open("rb") as f:
        lineno = 0
        while raw := f.readline(max_row_bytes + 2):  # the row and its line end ("\r\n")
            lineno += 1
            body = raw.rstrip(b"\r\n")
            if len(body) > max_row_bytes:
                at_least = not raw.endswith(b"\n")
                msg = _too_large(len(body), max_row_bytes, at_least)
                raise DataError(source, msg, line=lineno)
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(source, f"invalid UTF-8 ({e.reason})", line=lineno) from None
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                msg = f"invalid JSON: {e.msg} (column {e.colno})"
                raise DataError(source, msg, line=lineno) from None
            except RecursionError:
                msg = f"nested more than {MAX_ROW_DEPTH} levels deep"
                raise DataError(source, msg, line=lineno) from None
            check_depth(record, source, lineno, None)
            yield lineno, None, record


def arrow_records(
    batches: Iterable[Any],
    source: str,
    max_row_bytes: int,
    decode: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Iterator[Record]:
    """(None, row, record) for the rows of Arrow record batches or tables (``decode``:
    what a row's Arrow values stand for, e.g. a ``datasets`` feature's); a row whose
    Arrow data exceeds ``max_row_bytes`` is a DataError before it becomes Python objects."""
    row = 0
    for batch in batches:
        if batch.nbytes > max_row_bytes:  # (then some row may be too large: look at each)
            for i in range(batch.num_rows):
                if (size := batch.slice(i, 1).nbytes) > max_row_bytes:
                    raise DataError(source, _too_large(size, max_row_bytes), row=row + i)
        for record in batch.to_pylist():
            record = decode(record) if decode is not None else record
            check_depth(record, source, None, row)
            yield None, row, record
            row += 1


class JsonlTaskSource(_FileTaskSource):
    """One JSON object per line (see the module docstring for the schema)."""

    def _records(self, source: str) -> Iterator[Record]:
        return jsonl_records(source, self.max_row_bytes)


class ParquetTaskSource(_FileTaskSource):
    """A Parquet file, read in record batches with pyarrow."""

    def _records(self, source: str) -> Iterator[Record]:
        import pyarrow.parquet as pq

        if not Path(source).is_file():
            raise FileNotFoundError(f"Parquet file not found: {source}")
        try:
            parquet = pq.ParquetFile(source)
        except Exception as e:  # ArrowInvalid: empty or not a Parquet file
            raise DataError(source, f"not a readable Parquet file ({e})") from None
        batches = parquet.iter_batches(batch_size=TABLE_BATCH_ROWS)
        yield from arrow_records(batches, source, self.max_row_bytes)


class DatasetsTaskSource(_FileTaskSource):
    """A Hugging Face ``datasets`` source, always from local files.

    ``path`` is either a directory written by ``Dataset.save_to_disk`` /
    ``DatasetDict.save_to_disk`` (loaded with ``datasets.load_from_disk``), or one or
    more json/jsonl/parquet/csv files loaded with ``datasets.load_dataset(format,
    data_files=...)`` (``format`` inferred from the extension unless given). ``split``
    picks the split of a ``DatasetDict`` (the only one when there is a single split);
    ``eval_split`` names a split of the same dataset to use as the held-out set.
    """

    _FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}

    def __init__(
        self,
        path: str | Path,
        *,
        format: str | None = None,
        split: str | None = None,
        eval_split: str | None = None,
        cache_dir: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.format, self.split, self.cache_dir = format, split, cache_dir
        self.eval_split = eval_split
        if eval_split is not None:
            if kwargs.get("eval_path") is not None:
                raise ValueError("give either eval_split or eval_path, not both")
            kwargs["eval_path"] = f"{path}#{eval_split}"
        super().__init__(path, **kwargs)

    def _records(self, source: str) -> Iterator[Record]:
        path, split = source, self.split
        if self.eval_split is not None and source.endswith(f"#{self.eval_split}"):
            path, split = source[: -len(self.eval_split) - 1], self.eval_split
        ds = self._select(self._open(path), split, path)
        batches = ds.with_format("arrow").iter(batch_size=TABLE_BATCH_ROWS)
        decode = ds.features.decode_example
        yield from arrow_records(batches, source, self.max_row_bytes, decode)

    def _open(self, path: str) -> Any:
        import datasets

        p = Path(path)
        if p.is_dir():
            return datasets.load_from_disk(path)
        if not p.is_file():
            raise FileNotFoundError(f"dataset path not found: {path}")
        fmt = self.format or self._FORMATS.get(p.suffix.lower())
        if fmt is None:
            raise ValueError(f"{path}: cannot infer the format; pass format='json'|'parquet'|'csv'")
        return datasets.load_dataset(fmt, data_files=str(p), cache_dir=self.cache_dir)

    @staticmethod
    def _select(ds: Any, split: str | None, path: str) -> Any:
        if not hasattr(ds, "keys"):  # a single Dataset
            return ds
        names = list(ds.keys())
        if split is None:
            if len(names) != 1:
                raise ValueError(f"{path}: has splits {names}; pass split=<name>")
            split = names[0]
        if split not in ds:
            raise ValueError(f"{path}: no split {split!r}; available: {names}")
        return ds[split]
