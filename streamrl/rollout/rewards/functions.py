"""Reward functions: plain ``fn(completion: str, item: Item) -> float``.

Each function grades one completion against ``item.answer`` (or the item's
metadata). They may raise (e.g. an item without a reference answer): the reward
guard turns exceptions and timeouts into recorded failures, so none of them catches
broadly. Options are keyword arguments; bind them with ``functools.partial`` or
``get_reward(name, **options)``.

>>> from streamrl.core.types import Item
>>> item = Item(id="q1", prompt="12+34=", answer="46")
>>> exact_match(" 46 ", item), numeric_match("so 12+34 = 46.", item)
(1.0, 1.0)
"""

from __future__ import annotations

import logging
import math
import re
from functools import cache, lru_cache
from typing import Any

from streamrl.core.types import Item

# A number, optionally signed, with optional thousands separators, decimals and an
# exponent. A "-" right after a word character or ")" is an operator, not a sign.
_NUMBER = re.compile(
    r"(?:(?<![\w)])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|(?:(?<![\w)])-)?\.\d+"
)
# The default format: the whole completion is a single (signed) integer.
INTEGER_PATTERN = r"\s*-?\d+\s*"
# Answer tags anywhere in the completion: up to the first "<answer>", up to the first
# "</answer>" after it, then anything. (Written with tempered tokens, so a match costs
# time linear in the completion; ".*<answer>.*?</answer>.*" backtracks quadratically on
# a completion of many unclosed tags.)
ANSWER_TAG_PATTERN = r"(?s)(?:(?!<answer>).)*<answer>(?:(?!</answer>).)*</answer>.*"
_OPEN, _CLOSE = "<answer>", "</answer>"


def _reference(item: Item) -> str:
    if item.answer is None:
        raise ValueError(f"item {item.id!r} has no reference answer")
    return item.answer


def _normalise(text: str) -> str:
    return " ".join(text.split()).lower()


def exact_match(completion: str, item: Item) -> float:
    """1.0 if the completion equals the answer up to case and whitespace, else 0.0.

    >>> item = Item(id="q", prompt="Capital of France?", answer="Paris")
    >>> exact_match("  paris\\n", item), exact_match("Paris, France", item)
    (1.0, 0.0)
    """
    return float(_normalise(completion) == _normalise(_reference(item)))


def last_number(text: str) -> float | None:
    """The last number written in ``text`` (thousands separators allowed), or None.

    >>> last_number("12 apples, then 1,234.5 pears"), last_number("x-5"), last_number("none")
    (1234.5, 5.0, None)
    """
    matches = _NUMBER.findall(text)
    return float(matches[-1].replace(",", "")) if matches else None


def numeric_match(completion: str, item: Item, tol: float = 1e-6) -> float:
    """1.0 if the last number in the completion equals the numeric answer, else 0.0.

    Equal means ``|pred - gold| <= tol * max(1, |gold|)``. A non-numeric reference
    answer raises ``ValueError`` (a recorded failure, not a silent zero).

    >>> item = Item(id="q", prompt="12+34=", answer="46")
    >>> numeric_match("12+34=46", item), numeric_match("46.0000000001", item)
    (1.0, 1.0)
    >>> numeric_match("I think 45", item), numeric_match("no idea", item)
    (0.0, 0.0)
    """
    gold = last_number(_reference(item))
    if gold is None or _NUMBER.fullmatch(_reference(item).strip()) is None:
        raise ValueError(f"item {item.id!r}: answer {item.answer!r} is not a number")
    pred = last_number(completion)
    if pred is None or not math.isfinite(pred):
        return 0.0
    return float(abs(pred - gold) <= tol * max(1.0, abs(gold)))


def math_verify(completion: str, item: Item) -> float:
    """1.0 if math-verify judges the completion equivalent to the answer, else 0.0.

    Uses math-verify's ``parse`` and ``verify`` with their signal-based timeouts
    disabled (``parsing_timeout=None``, ``timeout_seconds=None``): ``signal.alarm``
    only works in the main thread, and rewards run in guard worker threads, whose
    timeout bounds this call instead.

    >>> item = Item(id="q", prompt="Half of one?", answer="\\\\frac{1}{2}")
    >>> math_verify("The answer is $0.5$", item), math_verify("\\\\boxed{1/3}", item)
    (1.0, 0.0)
    """
    from math_verify import parse, verify

    _quiet_math_verify()
    ref = _reference(item)
    gold = parse(ref, parsing_timeout=None) or parse(f"${ref}$", parsing_timeout=None)
    if not gold:
        raise ValueError(f"item {item.id!r}: math-verify cannot parse answer {ref!r}")
    pred = parse(completion, parsing_timeout=None)
    if not pred:
        return 0.0
    return float(verify(gold, pred, timeout_seconds=None))


def format_reward(completion: str, item: Item, pattern: str = INTEGER_PATTERN) -> float:
    """1.0 if the whole completion matches the regex ``pattern``, else 0.0.

    The default accepts a single integer; ``ANSWER_TAG_PATTERN`` requires
    ``<answer>...</answer>`` tags.

    >>> item = Item(id="q", prompt="12+34=", answer="46")
    >>> format_reward(" 46\\n", item), format_reward("46 apples", item)
    (1.0, 0.0)
    >>> format_reward("think... <answer>46</answer>", item, pattern=ANSWER_TAG_PATTERN)
    1.0
    """
    return float(_compiled(pattern).fullmatch(completion) is not None)


def extract_answer(completion: str) -> str:
    """The content of the last ``<answer>...</answer>`` tag, else the stripped completion.

    >>> extract_answer("<think>hmm</think><answer> 42 </answer>"), extract_answer(" 42 ")
    ('42', '42')
    """
    last, pos = None, 0
    while (start := completion.find(_OPEN, pos)) >= 0:  # (one pass: linear in the text)
        end = completion.find(_CLOSE, start + len(_OPEN))
        if end < 0:  # no tag after this one can close either
            break
        last, pos = completion[start + len(_OPEN) : end], end + len(_CLOSE)
    return (last if last is not None else completion).strip()


def reasoning_gym(completion: str, item: Item) -> float:
    """Score with the reasoning-gym task's own ``score_answer(answer, entry)``.

    Needs ``item.metadata["rg_task"]`` and ``["rg_entry"]`` (set by the
    ``reasoning_gym`` task source). The answer is the last ``<answer>`` tag's
    content when present, else the whole completion.

    >>> from streamrl.sources.reasoning_gym import ReasoningGymTaskSource
    >>> item = ReasoningGymTaskSource("leg_counting", size=4, heldout_size=1).heldout()[0]
    >>> reasoning_gym(f"<answer>{item.answer}</answer>", item)
    1.0
    """
    try:
        task, entry = item.metadata["rg_task"], item.metadata["rg_entry"]
    except KeyError as e:
        raise ValueError(
            f"item {item.id!r}: metadata lacks {e} (not a reasoning_gym item)"
        ) from None
    return float(_rg_scorer(task)(extract_answer(completion), entry))


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


@cache
def _rg_scorer(task: str) -> Any:
    import reasoning_gym as rg

    return rg.get_score_answer_fn(task)


class _DropTimeoutWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


@cache
def _quiet_math_verify() -> None:
    """Silence math-verify's 'timeout disabled' warning: our guard provides the timeout."""
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutWarning())
