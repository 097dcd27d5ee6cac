"""Group rewards: ``fn(completions, item, **options) -> list[float]``, one value per answer.

A group reward sees every answer the policy gave to one item (the group), so it can
score them relative to each other: agree with the majority (label-free, TTRL), prefer
the shorter correct answers (GRPO-λ), or penalise overlong ones (DAPO). It is a
component of ``reward.components`` like a per-answer reward and runs under the same
guard; the rollout worker calls it once a group's samples are in. ``completions`` is a
:class:`Completions` (a list of the answers' texts that also knows how many tokens each
answer generated); a plain list works too (lengths are then counted in characters).

>>> from streamrl.core.types import Item
>>> item = Item(id="q", prompt="2+2=")
>>> majority_vote(["4", "so 4", "5", "no idea"], item)
[1.0, 1.0, 0.0, 0.0]
>>> overlong_penalty(Completions(["a", "b", "c"], lengths=[6, 9, 12]), item,
...                  max_length=12, cache_length=4)
[0.0, -0.25, -1.0]
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from streamrl.core.types import Item
from streamrl.rollout.rewards import functions

GroupRewardFn = Callable[[Sequence[str], Item], list[float]]


class Completions(list[str]):
    """The answers of one group, in sample order, and ``lengths``: the tokens each
    generated (the rollout worker fills it; by default the characters of each text)."""

    def __init__(self, texts: Sequence[str], lengths: Sequence[int] | None = None) -> None:
        super().__init__(texts)
        self.lengths = list(lengths) if lengths is not None else [len(t) for t in texts]
        if len(self.lengths) != len(self):
            raise ValueError(f"{len(self)} completions but {len(self.lengths)} lengths")

    def __reduce__(self) -> tuple[Any, ...]:  # (pickles for process isolation)
        return (Completions, (list(self), self.lengths))


class Scores(list[float]):
    """A group reward's values with ``details``: for each answer a dict of named numbers
    (a rubric's per-criterion scores) that the rollout worker keeps in the sample's
    ``metadata["reward_details"][<component>]`` and the step metrics average as
    ``reward/<component>/<name>``.

    >>> Scores([1.0, 0.5], [{"clear": 1.0}, {"clear": 0.0}]).details[1]
    {'clear': 0.0}
    """

    def __init__(self, values: Sequence[float], details: Sequence[dict[str, float]]) -> None:
        super().__init__(values)
        self.details = [dict(d) for d in details]
        if len(self.details) != len(self):
            raise ValueError(f"{len(self)} values but {len(self.details)} details")

    def __reduce__(self) -> tuple[Any, ...]:  # (pickles for process isolation)
        return (Scores, (list(self), self.details))


def lengths_of(completions: Sequence[str]) -> list[int]:
    """The answers' lengths: their tokens for :class:`Completions`, else characters.

    >>> lengths_of(["ab", "abc"]), lengths_of(Completions(["ab"], lengths=[7]))
    ([2, 3], [7])
    """
    if isinstance(completions, Completions):
        return completions.lengths
    return [len(c) for c in completions]


# How majority_vote reads an answer out of a completion (None: no answer, no vote).
def _last_number(text: str) -> str | None:
    number = functions.last_number(text)
    return None if number is None else repr(number)


def _answer_tag(text: str) -> str | None:
    return functions.extract_answer(text) or None


def _boxed(text: str) -> str | None:
    found = re.findall(r"\\boxed\{([^{}]*)\}", text)
    return found[-1].strip() if found else None


def _normalised(text: str) -> str | None:
    return " ".join(text.split()).lower() or None


EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "last_number": _last_number,
    "answer_tag": _answer_tag,
    "boxed": _boxed,
    "text": _normalised,
}


def extractor(name: str) -> Callable[[str], str | None]:
    """The extraction named ``name`` (:data:`EXTRACTORS`), or ``"regex:<pattern>"``: the
    pattern's first group (else whole match) at its last match.

    >>> extractor("regex:answer is (\\\\w+)")("the answer is B, not C")
    'B'
    """
    if name.startswith("regex:"):
        pattern = re.compile(name[len("regex:") :])

        def by_regex(text: str) -> str | None:
            found = list(pattern.finditer(text))
            if not found:
                return None
            last = found[-1]
            return (last.group(1) if pattern.groups else last.group(0)).strip() or None

        return by_regex
    if name not in EXTRACTORS:
        known = ", ".join([*EXTRACTORS, "regex:<pattern>"])
        raise ValueError(f"majority_vote: unknown extract {name!r}; known: {known}")
    return EXTRACTORS[name]


def majority_vote(
    completions: Sequence[str], item: Item, extract: str = "last_number", min_votes: int = 1
) -> list[float]:
    """1.0 for each answer that agrees with the group's most common answer, else 0.0.

    Label-free (TTRL): ``item.answer`` is never read. ``extract`` reads the answer out
    of a completion (``last_number``, ``answer_tag``, ``boxed``, ``text`` or
    ``regex:<pattern>``); a completion with no answer does not vote and scores 0. A tie
    goes to the answer given first. With fewer than ``min_votes`` votes for the
    majority answer, every answer scores 0 (no consensus to reward).

    >>> majority_vote(["x=3", "3", "4", "4"], Item(id="q", prompt="?"))
    [1.0, 1.0, 0.0, 0.0]
    >>> majority_vote(["3", "3", "4"], Item(id="q", prompt="?"), min_votes=3)
    [0.0, 0.0, 0.0]
    """
    read = extractor(extract)
    answers = [read(c) for c in completions]
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return [0.0] * len(answers)
    top = max(votes.values())
    majority = next(a for a in answers if a is not None and votes[a] == top)
    if top < min_votes:
        return [0.0] * len(answers)
    return [float(a == majority) for a in answers]


def overlong_penalty(
    completions: Sequence[str], item: Item, max_length: int = 512, cache_length: int = 128
) -> list[float]:
    """DAPO's soft overlong punishment, per answer of length ``L`` (tokens):
    0 while ``L <= max_length - cache_length``, then falling linearly to -1 at
    ``max_length``: ``((max_length - cache_length) - L) / cache_length``, and -1 beyond.

    >>> overlong_penalty(Completions(["", "", ""], lengths=[100, 110, 200]), None,
    ...                  max_length=120, cache_length=20)
    [0.0, -0.5, -1.0]
    """
    if not 0 < cache_length <= max_length:
        raise ValueError(f"need 0 < cache_length <= max_length, got {cache_length}, {max_length}")
    free = max_length - cache_length
    return [
        0.0 if n <= free else -1.0 if n > max_length else (free - n) / cache_length
        for n in lengths_of(completions)
    ]


# the per-answer checks length_aware can take for correctness
CORRECTNESS: dict[str, Callable[[str, Item], float]] = {
    "numeric_match": functions.numeric_match,
    "exact_match": functions.exact_match,
    "math_verify": functions.math_verify,
    "reasoning_gym": functions.reasoning_gym,
}


def length_aware(
    completions: Sequence[str],
    item: Item,
    correct: str = "numeric_match",
    min_correct_fraction: float = 0.5,
) -> list[float]:
    """A length bonus for the group (GRPO-λ): when at least ``min_correct_fraction`` of
    the answers are correct (per the rule-based check ``correct``, one of
    :data:`CORRECTNESS`, value >= 1), each
    answer gets ``λ = 0.5 - (L - L_min) / (L_max - L_min)`` over the group's lengths
    (Kimi k1.5's length reward), correct ones ``λ``, wrong ones ``min(0, λ)``; otherwise
    every answer gets 0 (the group still needs accuracy, not brevity). Add it to the
    correctness reward with a weight.

    >>> item = Item(id="q", prompt="2+2=", answer="4")
    >>> length_aware(Completions(["4", "4", "5", "4"], lengths=[10, 20, 30, 30]), item)
    [0.5, 0.0, -0.5, -0.5]
    >>> length_aware(Completions(["4", "5", "5"], lengths=[1, 2, 3]), item)
    [0.0, 0.0, 0.0]
    """
    if correct not in CORRECTNESS:
        raise ValueError(f"length_aware: correct={correct!r}; known: {', '.join(CORRECTNESS)}")
    judge = CORRECTNESS[correct]
    right = [judge(c, item) >= 1.0 for c in completions]
    if not right or sum(right) < min_correct_fraction * len(right):
        return [0.0] * len(right)
    lengths = lengths_of(completions)
    lo, hi = min(lengths), max(lengths)
    lams = [0.0 if hi == lo else 0.5 - (n - lo) / (hi - lo) for n in lengths]
    return [lam if ok else min(0.0, lam) for lam, ok in zip(lams, right, strict=True)]


def check_values(values: Any, n: int) -> list[float]:
    """A group reward's result as ``n`` finite floats, else a ValueError/TypeError
    that says what came back (the guard records it as the component's failure).

    >>> check_values((1, 0.5), 2)
    [1.0, 0.5]
    >>> check_values([1.0], 3)
    Traceback (most recent call last):
    ValueError: group reward returned 1 values for 3 completions
    """
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise TypeError(f"group reward returned {type(values).__name__}, expected a list")
    if len(values) != n:
        raise ValueError(f"group reward returned {len(values)} values for {n} completions")
    out = []
    for v in values:
        if isinstance(v, str | bytes) or not hasattr(v, "__float__"):
            raise TypeError(f"group reward returned a {type(v).__name__}, expected floats")
        if not math.isfinite(number := float(v)):
            raise ValueError(f"group reward returned {number}")
        out.append(number)
    if isinstance(values, Scores):
        return Scores(out, [check_details(d) for d in values.details])
    return out


def check_details(details: Any) -> dict[str, float]:
    """One answer's details as finite floats by name (else the component's failure)."""
    if not isinstance(details, dict):
        raise TypeError(f"group reward details are a {type(details).__name__}, expected a dict")
    out = {}
    for key, v in details.items():
        if isinstance(v, str | bytes) or not hasattr(v, "__float__"):
            raise TypeError(f"group reward detail {key!r} is a {type(v).__name__}")
        if not math.isfinite(number := float(v)):
            raise ValueError(f"group reward detail {key!r} is {number}")
        out[str(key)] = number
    return out


def run_group(fn: GroupRewardFn, completions: Sequence[str], item: Item) -> list[float]:
    """``fn(completions, item)`` checked (:func:`check_values`): what the guard runs, in a
    worker thread or process, so that a wrong result is the component's counted failure."""
    return check_values(fn(completions, item), len(completions))


_GROUP_FNS: set[Callable[..., Any]] = set()
G = TypeVar("G", bound=Callable[..., Any])


def group_reward(fn: G) -> G:
    """Mark ``fn(completions, item, **options) -> list[float]`` as a group reward, so that
    :class:`~streamrl.rollout.rewards.CompositeReward` given the function itself (not a
    registered name) scores whole groups with it."""
    _GROUP_FNS.add(fn)
    return fn


def is_group_reward(fn: Any) -> bool:
    """Whether ``fn`` (or the function a ``functools.partial`` binds) is a group reward."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    try:
        return fn in _GROUP_FNS
    except TypeError:  # unhashable callable
        return False


GROUP_REWARDS: dict[str, Callable[..., list[float]]] = {
    "majority_vote": group_reward(majority_vote),
    "overlong_penalty": group_reward(overlong_penalty),
    "length_aware": group_reward(length_aware),
}
