"""``reward_model``: the score of a sequence-classification model, batched across calls.

Options (``reward.components: [{name: reward_model, options: {path: ...}}]``):

- ``path``: a local directory saved with ``save_pretrained`` (model and tokenizer) of an
  ``AutoModelForSequenceClassification``; nothing is ever downloaded.
- ``template``: how the scored text is made, with ``{prompt}``, ``{completion}`` and
  ``{answer}`` placeholders (other braces doubled: ``{{ }}``). ``{prompt}`` is the
  item's prompt, or its chat messages as ``role: content`` lines. Default (None): the
  prompt exactly as a policy sees it (chat messages through the reward model's
  tokenizer's chat template, generation prompt appended, when it has one) followed by
  the completion.
- ``label``: which logit is the score (default 0; a 1-label head has only that one);
  ``sigmoid``: pass it through a sigmoid (a probability in (0, 1)).
- ``batch_size`` / ``max_wait_ms``: concurrent calls (a rollout worker scores a whole
  group at once, and the reward guard runs components in worker threads) are gathered
  for up to ``max_wait_ms`` after the oldest one arrived into one forward pass of up to
  ``batch_size`` texts, padded on the tokenizer's side with the attention mask (and
  position ids) masking the padding, so a batched score equals the one-at-a-time score.
- ``device``: where the model runs (``"cpu"``, ``"cuda"``, ...).

The model is loaded once per process (cached by path and device). Under thread
isolation :class:`~streamrl.rollout.rewards.CompositeReward` loads it when it is built, so a
wrong path fails the build and no guarded call is charged the loading. Under process
isolation each reward worker loads its own copy on its first call (which must fit in
``reward.timeout_s``), and a worker runs one call at a time, so batches form only
under thread isolation.

The template helpers are shared with ``llm_judge``:

>>> from streamrl.core.types import Item
>>> item = Item(id="q", messages=[{"role": "user", "content": "12+34="}], answer="46")
>>> fill_template("Q: {prompt} A: {completion} (gold {answer})", item, "46")
'Q: user: 12+34= A: 46 (gold 46)'
"""

from __future__ import annotations

import math
import os
import string
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from streamrl.core.types import Item

T = TypeVar("T")
R = TypeVar("R")

PLACEHOLDERS = ("prompt", "completion", "answer")


# ----------------------------------------------------------------------------- templates


def check_template(template: str, allowed: Sequence[str] = PLACEHOLDERS) -> set[str]:
    """The placeholders ``template`` uses; ValueError unless all are ``allowed`` (by
    default ``{prompt}``, ``{completion}``, ``{answer}``).

    >>> sorted(check_template("{prompt} -> {completion}"))
    ['completion', 'prompt']
    >>> check_template("{question}")
    Traceback (most recent call last):
    ...
    ValueError: template: unknown placeholder {question}; use {prompt}, {completion}, {answer} (write literal braces as {{ and }})
    """
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:  # e.g. a single '{'
        raise ValueError(f"template: {e} (write literal braces as {{{{ and }}}})") from None
    for name in fields:
        if name not in allowed:
            use = ", ".join(f"{{{a}}}" for a in allowed)
            raise ValueError(
                f"template: unknown placeholder {{{name}}}; use {use} "
                "(write literal braces as {{ and }})"
            )
    return set(fields)


def plain_prompt(item: Item) -> str:
    """The item's prompt; chat messages as ``role: content`` lines.

    >>> plain_prompt(Item(id="q", prompt="12+34="))
    '12+34='
    """
    if (item.prompt is None) == (item.messages is None):
        raise ValueError(f"item {item.id!r}: exactly one of `prompt` or `messages` must be set")
    if item.messages is not None:
        return "\n".join(f"{m['role']}: {m['content']}" for m in item.messages)
    return item.prompt or ""


def fill_template(template: str, item: Item, completion: str, **extra: str) -> str:
    """``template`` with ``{prompt}``, ``{completion}`` and ``{answer}`` filled in (and
    the ``extra`` placeholders a caller allows, e.g. a rubric's ``{criterion}``).

    ``{answer}`` on an item without a reference answer raises ValueError (a recorded
    failure, not a silently empty reference).
    """
    if "answer" in check_template(template, (*PLACEHOLDERS, *extra)) and item.answer is None:
        raise ValueError(f"item {item.id!r} has no reference answer for the template's {{answer}}")
    return template.format(
        prompt=plain_prompt(item), completion=completion, answer=item.answer, **extra
    )


# ----------------------------------------------------------------------------- batching


class MicroBatcher(Generic[T, R]):
    """Gathers concurrent :meth:`submit` calls into calls of ``fn(list[T]) -> list[R]``.

    The first caller that finds no batch in progress leads: it waits until
    ``batch_size`` inputs are pending or ``max_wait_s`` has passed since the oldest
    pending one arrived, takes up to ``batch_size`` of them, runs ``fn`` (one batch at
    a time) and hands every caller its result (or ``fn``'s exception). Callers left
    pending then elect the next leader. ``batches`` counts the calls of ``fn``.
    """

    def __init__(self, fn: Callable[[list[T]], Sequence[R]], batch_size: int, max_wait_s: float):
        if batch_size < 1 or max_wait_s < 0:
            raise ValueError("need batch_size >= 1 and max_wait_s >= 0")
        self.fn, self.batch_size, self.max_wait_s = fn, batch_size, max_wait_s
        self.batches = 0
        self._cond = threading.Condition()
        self._pending: list[tuple[float, T, Future]] = []  # (arrival, input, its result)
        self._busy = False  # a leader is gathering or running a batch

    def submit(self, x: T) -> R:
        """``fn([x, ...])``'s result for ``x``, computed in a batch with concurrent calls."""
        future: Future = Future()
        with self._cond:
            self._pending.append((time.monotonic(), x, future))
            self._cond.notify_all()  # a leader may be waiting for a full batch
            while not future.done():
                if self._busy or not self._pending:
                    self._cond.wait()
                    continue
                self._busy = True
                deadline = self._pending[0][0] + self.max_wait_s
                while len(self._pending) < self.batch_size:
                    if (left := deadline - time.monotonic()) <= 0:
                        break
                    self._cond.wait(left)
                batch = self._pending[: self.batch_size]
                del self._pending[: self.batch_size]
                self._cond.release()  # run the batch without holding up new arrivals
                try:
                    self._run(batch)
                finally:
                    self._cond.acquire()
                    self._busy = False
                    self._cond.notify_all()  # results are in; a pending caller may lead
        return future.result()

    def _run(self, batch: list[tuple[float, T, Future]]) -> None:
        try:
            results = list(self.fn([x for _, x, _ in batch]))
            if len(results) != len(batch):
                raise RuntimeError(f"batched function returned {len(results)} for {len(batch)}")
        except BaseException as e:  # every caller of the batch gets the failure
            for _, _, future in batch:
                future.set_exception(e)
            if not isinstance(e, Exception):
                raise
        else:
            self.batches += 1
            for (_, _, future), result in zip(batch, results, strict=True):
                future.set_result(result)


# ----------------------------------------------------------------------------- the model


@dataclass
class LoadedRewardModel:
    """A sequence-classification model and its tokenizer, ready for padded batches."""

    model: Any
    tokenizer: Any
    device: str
    pad_id: int | None  # None: no pad token, so every text is its own forward
    takes_positions: bool  # the forward accepts position_ids
    max_length: int | None
    forwards: int = 0  # model forward passes run (tests, metrics)

    def encode(self, item: Item, completion: str, template: str | None) -> list[int]:
        """Token ids of the text the model scores for ``completion`` on ``item``."""
        tok = self.tokenizer
        if template is not None:
            ids = tok.encode(fill_template(template, item, completion))
        elif item.messages is not None and getattr(tok, "chat_template", None):
            plain_prompt(item)  # (checks the item)
            rendered = tok.apply_chat_template(
                item.messages, add_generation_prompt=True, tokenize=False
            )
            # the rendering already holds the special tokens (as text): add none
            ids = tok.encode(rendered + completion, add_special_tokens=False)
        else:
            ids = tok.encode(plain_prompt(item) + completion)
        if not ids:
            raise ValueError(f"item {item.id!r}: the text to score is empty")
        if self.max_length is not None and len(ids) > self.max_length:
            raise ValueError(
                f"item {item.id!r}: the text to score is {len(ids)} tokens; the reward model "
                f"takes at most {self.max_length}"
            )
        return [int(i) for i in ids]

    def logits(self, batch: list[list[int]]) -> list[list[float]]:
        """One forward pass over ``batch`` (padded): each text's logits (num_labels,)."""
        import torch

        if self.pad_id is None and len(batch) > 1:
            return [row for ids in batch for row in self.logits([ids])]
        n, width = len(batch), max(len(ids) for ids in batch)
        input_ids = torch.full((n, width), self.pad_id or 0, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        left = self.tokenizer.padding_side == "left"
        for row, ids in enumerate(batch):
            span = slice(width - len(ids), width) if left else slice(0, len(ids))
            input_ids[row, span] = torch.tensor(ids)
            mask[row, span] = 1
        kwargs: dict[str, Any] = {"attention_mask": mask.to(self.device)}
        if self.takes_positions:  # the real tokens of a left-padded row start at position 0
            kwargs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0).to(self.device)
        with torch.inference_mode():
            out = self.model(input_ids=input_ids.to(self.device), **kwargs)
        self.forwards += 1
        return out.logits.float().cpu().tolist()


_LOCK = threading.Lock()
_MODELS: dict[tuple[str, str], LoadedRewardModel] = {}
_BATCHERS: dict[tuple[str, str, int, float], MicroBatcher[list[int], list[float]]] = {}


def check_model_dir(path: str) -> str:
    """The absolute path of the checkpoint directory ``path``, or a FileNotFoundError."""
    full = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.isdir(full):
        raise FileNotFoundError(
            f"reward_model: no model directory at {path!r} (option path must be a local "
            "directory saved with save_pretrained; nothing is downloaded)"
        )
    if not os.path.isfile(os.path.join(full, "config.json")):
        raise FileNotFoundError(
            f"reward_model: {path!r} has no config.json, so it is not a saved model directory"
        )
    return full


def load_reward_model(path: str, device: str = "cpu") -> LoadedRewardModel:
    """The reward model in directory ``path`` on ``device``, loaded once per process."""
    import inspect

    key = (check_model_dir(path), device)
    with _LOCK:  # (two first calls at once load it once)
        if key in _MODELS:
            return _MODELS[key]
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(key[0], local_files_only=True)
        model = AutoModelForSequenceClassification.from_pretrained(key[0], local_files_only=True)
        model = model.to(device).eval()
        pad_id = tokenizer.pad_token_id
        if pad_id is None:
            pad_id = tokenizer.eos_token_id
        if pad_id is not None and model.config.pad_token_id is None:
            # decoder heads pool the rightmost non-pad token, so they must know the pad id
            model.config.pad_token_id = pad_id
        takes_positions = "position_ids" in inspect.signature(model.forward).parameters
        max_length = getattr(model.config, "max_position_embeddings", None)
        loaded = LoadedRewardModel(model, tokenizer, device, pad_id, takes_positions, max_length)
        _MODELS[key] = loaded
        return loaded


def _batcher(
    path: str, device: str, batch_size: int, max_wait_ms: float
) -> tuple[LoadedRewardModel, MicroBatcher[list[int], list[float]]]:
    loaded = load_reward_model(path, device)
    key = (check_model_dir(path), device, batch_size, float(max_wait_ms))
    with _LOCK:
        if key not in _BATCHERS:
            _BATCHERS[key] = MicroBatcher(loaded.logits, batch_size, max_wait_ms / 1000)
        return loaded, _BATCHERS[key]


def reward_model(
    completion: str,
    item: Item,
    path: str,
    label: int = 0,
    sigmoid: bool = False,
    template: str | None = None,
    batch_size: int = 16,
    max_wait_ms: float = 5.0,
    device: str = "cpu",
) -> float:
    """The reward model's logit ``label`` for the item's prompt and ``completion``.

    See the module docstring for the options; concurrent calls share forward passes.
    """
    loaded, batcher = _batcher(path, device, batch_size, max_wait_ms)
    num_labels = int(loaded.model.config.num_labels)
    if num_labels == 1:
        label = 0  # a 1-label head: its only logit
    if not 0 <= label < num_labels:
        raise ValueError(f"reward_model: label {label} is not in [0, {num_labels})")
    score = batcher.submit(loaded.encode(item, completion, template))[label]
    return 1.0 / (1.0 + math.exp(-score)) if sigmoid else float(score)


def setup(options: dict[str, Any], load: bool) -> None:
    """Check ``reward_model``'s options when a composite is built; load the model if
    ``load`` (the calls run in this process)."""
    if "path" not in options:
        raise ValueError("reward_model needs option 'path' (a local model directory)")
    check_model_dir(options["path"])
    if options.get("template") is not None:
        check_template(options["template"])
    if int(options.get("batch_size", 16)) < 1 or float(options.get("max_wait_ms", 5.0)) < 0:
        raise ValueError("reward_model: need batch_size >= 1 and max_wait_ms >= 0")
    if load:
        _batcher(
            options["path"],
            options.get("device", "cpu"),
            int(options.get("batch_size", 16)),
            float(options.get("max_wait_ms", 5.0)),
        )
