"""The ``search`` tool: BM25 (``bm25s``) over a local corpus of passages with ids.

The corpus is a JSONL file with one ``{"id": ..., "text": ...}`` per line, or, for tests
and small tasks, a list of such dicts or of plain strings (their ids are their
positions). It is indexed once, when the tool is built.

>>> tool = search_tool([{"id": "paris", "text": "Paris is the capital of France."},
...                     {"id": "cats", "text": "Cats sleep most of the day."}])
>>> print(tool.fn("capital of France", k=2))
[paris] Paris is the capital of France.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from streamrl.rollout.tools.base import Tool

Corpus = str | Path | Sequence[dict[str, Any] | str]


def load_corpus(corpus: Corpus) -> list[tuple[str, str]]:
    """``[(id, text), ...]`` from a JSONL path or an in-memory list; ValueError names the line.

    >>> load_corpus(["a b", {"id": "x", "text": "c d"}])
    [('0', 'a b'), ('x', 'c d')]
    """
    if isinstance(corpus, str | Path):
        from streamrl.sources.files import jsonl_records  # (bounded rows, located errors)

        try:
            read = list(jsonl_records(str(corpus)))
        except OSError as exc:
            raise ValueError(f"search corpus {str(corpus)!r}: {exc.strerror or exc}") from None
        records: list[Any] = [record for _, _, record in read]
        where = [f"{corpus}:{line}" for line, _, _ in read]
    else:
        records = list(corpus)
        where = [f"search corpus item {i}" for i in range(len(records))]
    docs = []
    for i, (record, at) in enumerate(zip(records, where, strict=True)):
        if isinstance(record, str):
            docs.append((str(i), record))
        elif isinstance(record, dict) and isinstance(record.get("text"), str):
            docs.append((str(record.get("id", i)), record["text"]))
        else:
            raise ValueError(f'{at}: expected {{"id": ..., "text": "..."}}, got {record!r:.60}')
    if not docs:
        raise ValueError("the search corpus is empty")
    return docs


class BM25Index:
    """A BM25 index over ``(id, text)`` passages; :meth:`search` is thread-safe."""

    def __init__(self, docs: list[tuple[str, str]], *, stopwords: str | None = "en") -> None:
        import bm25s

        self._bm25s = bm25s
        self.docs = docs
        self.stopwords = stopwords
        self.retriever = bm25s.BM25()
        tokens = bm25s.tokenize(
            [text for _, text in docs], stopwords=stopwords, show_progress=False
        )
        self.retriever.index(tokens, show_progress=False)
        self._lock = threading.Lock()

    def search(self, query: str, k: int) -> list[tuple[str, str, float]]:
        """The best ``k`` passages with a positive score, best first: ``(id, text, score)``."""
        tokens = self._bm25s.tokenize(
            [query], stopwords=self.stopwords, show_progress=False, return_ids=False
        )
        k = min(k, len(self.docs))
        with self._lock:
            found, scores = self.retriever.retrieve(tokens, k=k, show_progress=False)
        return [
            (*self.docs[int(i)], float(s))
            for i, s in zip(found[0], scores[0], strict=True)
            if s > 0
        ]


def search_tool(
    corpus: Corpus,
    *,
    max_k: int = 10,
    max_chars: int = 500,
    stopwords: str | None = "en",
    timeout_s: float = 10.0,
) -> Tool:
    """The ``search`` tool over ``corpus``; passages are cut to ``max_chars`` characters."""
    if max_k < 1 or max_chars < 1:
        raise ValueError("search: max_k and max_chars must be >= 1")
    index = BM25Index(load_corpus(corpus), stopwords=stopwords)

    def search(query: str, k: int = 3) -> str:
        """Search the documents and return the best passages, each after its [id].

        Args:
            query: what to look for, in a few keywords
            k: how many passages to return
        """
        if k < 1:
            raise ValueError("k must be at least 1")
        hits = index.search(query, min(k, max_k))
        if not hits:
            return f"no passage matches {query!r}"
        return "\n".join(f"[{doc_id}] {_cut(text, max_chars)}" for doc_id, text, _ in hits)

    return Tool(search, timeout_s=timeout_s)


def _cut(text: str, limit: int) -> str:
    """The text on one line, cut to ``limit`` characters.

    >>> _cut("one two three", 7)
    'one tw…'
    """
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
