"""Procedurally generated Python function tasks with hidden tests (kind ``code``).

A problem is a family (``add_k``: "return x plus k") and its parameters (k = 7): the
prompt gives the signature, what the function does and ``examples`` worked calls; the
item's ``metadata["tests"]`` holds ``tests`` further calls and their results, which
only the ``unit_tests`` reward sees (never the prompt). Every family has a reference
solution (``metadata["reference"]``) that passes its own tests.

Everything is deterministic: a problem's examples and tests come from a generator seeded
by its id, training draws problems from ``random.Random(seed)``, and a problem is
held out iff a stable hash of its id falls in ``heldout_fraction`` of hash space (the
two splits never share a problem). ``difficulty`` picks the families up to a level
(1: one operation on a number or string; 2: a list comprehension or a count; 3: two
steps).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from streamrl.core.types import Item
from streamrl.sources.base import TaskSource, in_heldout, stable_hash

Args = list[Any]


@dataclass(frozen=True)
class Family:
    """One kind of task: ``describe(p)`` and ``solve(p, *args)`` for a parameter ``p``
    from ``params``, random arguments from ``inputs(rng)``."""

    name: str
    level: int
    signature: str  # the parameters, e.g. "x"
    describe: Callable[[int], str]
    solve: Callable[..., Any]
    reference: str  # the solution's body, with {p} for the parameter
    inputs: Callable[[random.Random], Args]
    params: range


def _ints(rng: random.Random) -> Args:
    return [rng.randint(-50, 50)]


def _nat(rng: random.Random) -> Args:
    return [rng.randint(0, 99)]


def _word(rng: random.Random) -> Args:
    return ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 6)))]


def _list(rng: random.Random) -> Args:
    return [[rng.randint(0, 20) for _ in range(rng.randint(0, 7))]]


FAMILIES: tuple[Family, ...] = (
    Family(
        "add_k",
        1,
        "x",
        lambda k: f"x plus {k}",
        lambda k, x: x + k,
        "return x + {p}",
        _ints,
        range(1, 31),
    ),
    Family(
        "times_k",
        1,
        "x",
        lambda k: f"x multiplied by {k}",
        lambda k, x: x * k,
        "return x * {p}",
        _ints,
        range(2, 22),
    ),
    Family(
        "repeat_k",
        1,
        "s",
        lambda k: f"the string s repeated {k} times",
        lambda k, s: s * k,
        "return s * {p}",
        _word,
        range(2, 12),
    ),
    Family(
        "mod_k",
        1,
        "x",
        lambda k: f"the remainder of x divided by {k}",
        lambda k, x: x % k,
        "return x % {p}",
        _nat,
        range(2, 22),
    ),
    Family(
        "add_to_each",
        2,
        "xs",
        lambda k: f"a new list with {k} added to each element of the list xs",
        lambda k, xs: [x + k for x in xs],
        "return [x + {p} for x in xs]",
        _list,
        range(1, 21),
    ),
    Family(
        "count_k",
        2,
        "xs",
        lambda k: f"how many times {k} occurs in the list xs",
        lambda k, xs: xs.count(k),
        "return xs.count({p})",
        _list,
        range(0, 21),
    ),
    Family(
        "keep_above",
        2,
        "xs",
        lambda k: f"the elements of the list xs that are greater than {k}, in order",
        lambda k, xs: [x for x in xs if x > k],
        "return [x for x in xs if x > {p}]",
        _list,
        range(0, 20),
    ),
    Family(
        "sum_plus_k",
        2,
        "xs",
        lambda k: f"the sum of the list xs plus {k}",
        lambda k, xs: sum(xs) + k,
        "return sum(xs) + {p}",
        _list,
        range(1, 21),
    ),
    Family(
        "double_then_add",
        3,
        "x",
        lambda k: f"x times 2, plus {k}",
        lambda k, x: 2 * x + k,
        "return 2 * x + {p}",
        _ints,
        range(1, 21),
    ),
    Family(
        "sum_of_multiples",
        3,
        "xs",
        lambda k: f"the sum of the elements of the list xs divisible by {k}",
        lambda k, xs: sum(x for x in xs if x % k == 0),
        "return sum(x for x in xs if x % {p} == 0)",
        _list,
        range(2, 12),
    ),
)
FORMATS = ("chat", "plain")
CHAT_TEMPLATE = (
    "Write a Python function `{name}({signature})` that returns {description}.\n"
    "Examples:\n{examples}\n"
    "Reply with only the function in a ```python code block."
)


def family(name: str) -> Family:
    for f in FAMILIES:
        if f.name == name:
            return f
    raise ValueError(f"unknown code task family {name!r}; known: {', '.join(family_names())}")


def family_names() -> list[str]:
    return [f.name for f in FAMILIES]


class CodeTaskSource(TaskSource):
    """Python function tasks, each with visible examples and hidden tests.

    Args:
        difficulty: the highest family level drawn (1-3).
        families: a comma-separated subset of the families (empty: every family up to
            ``difficulty``).
        examples: worked calls shown in the prompt.
        tests: hidden test calls in ``metadata["tests"]`` (none of them an example).
        format: ``"chat"`` (one user message asking for a fenced block) or ``"plain"``
            (the prompt is the function's ``def`` line and docstring; the completion is
            its body, and ``metadata["prefix"]`` holds the prompt for the reward).
        heldout_size: how many held-out problems ``heldout()`` returns at most.
        heldout_fraction: share of the problems reserved for held-out.
    """

    def __init__(
        self,
        difficulty: int = 3,
        families: str = "",
        examples: int = 2,
        tests: int = 5,
        format: Literal["chat", "plain"] = "chat",
        heldout_size: int = 100,
        heldout_fraction: float = 0.25,
    ) -> None:
        if not 1 <= difficulty <= 3:
            raise ValueError(f"difficulty must be 1, 2 or 3, got {difficulty}")
        if examples < 0 or tests < 1:
            raise ValueError(f"need examples >= 0 and tests >= 1, got {examples}, {tests}")
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
        if not 0.0 < heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        names = [n.strip() for n in families.split(",") if n.strip()]
        chosen = [family(n) for n in names] or [f for f in FAMILIES if f.level <= difficulty]
        self.families, self.examples, self.tests, self.format = chosen, examples, tests, format
        self.heldout_size, self.heldout_fraction = heldout_size, heldout_fraction
        self.problems = [(f, p) for f in chosen for p in f.params]
        self._train = [fp for fp in self.problems if not self.is_heldout(*fp)]
        self._held = [fp for fp in self.problems if self.is_heldout(*fp)]
        if not self._train:
            raise ValueError("every problem is held out: lower heldout_fraction")
        random.Random("streamrl-code-heldout").shuffle(self._held)

    def is_heldout(self, fam: Family, param: int) -> bool:
        return in_heldout(problem_id(fam, param), self.heldout_fraction)

    def make_item(self, fam: Family, param: int) -> Item:
        """The item of one problem: prompt with examples, hidden tests in metadata."""
        calls = _calls(fam, param, self.examples + self.tests)
        shown, hidden = calls[: self.examples], calls[self.examples :]
        metadata: dict[str, Any] = {
            "entry_point": fam.name,
            "tests": [{"args": args, "expected": out} for args, out in hidden],
            "family": fam.name,
            "level": fam.level,
            "param": param,
            "reference": f"def {fam.name}({fam.signature}):\n    "
            + fam.reference.format(p=param)
            + "\n",
        }
        examples = "\n".join(f"{fam.name}({_args(a)}) == {out!r}" for a, out in shown)
        description = fam.describe(param)
        if self.format == "chat":
            text = CHAT_TEMPLATE.format(
                name=fam.name, signature=fam.signature, description=description, examples=examples
            )
            prompt, messages = None, [{"role": "user", "content": text}]
        else:
            doc = "\n".join(f"    >>> {fam.name}({_args(a)})\n    {out!r}" for a, out in shown)
            prompt = f'def {fam.name}({fam.signature}):\n    """Return {description}.\n'
            prompt += f'{doc}\n    """\n' if doc else '    """\n'
            messages = None
            metadata["prefix"] = prompt
        return Item(id=problem_id(fam, param), prompt=prompt, messages=messages, metadata=metadata)

    def train_iter(self, seed: int) -> Iterator[Item]:
        rng = random.Random(seed)
        while True:
            yield self.make_item(*rng.choice(self._train))

    def heldout(self, n: int | None = None) -> list[Item]:
        held = self._held[: self.heldout_size]
        return [self.make_item(*fp) for fp in (held if n is None else held[:n])]


def problem_id(fam: Family, param: int) -> str:
    return f"code:{fam.name}:{param}"


def _calls(fam: Family, param: int, n: int) -> list[tuple[Args, Any]]:
    """``n`` distinct calls (arguments, result) of the problem, the same every time."""
    rng = random.Random(stable_hash(problem_id(fam, param)))
    seen: set[str] = set()
    calls: list[tuple[Args, Any]] = []
    for _ in range(50 * n):
        args = fam.inputs(rng)
        if (key := repr(args)) in seen:
            continue
        seen.add(key)
        calls.append((args, fam.solve(param, *args)))
        if len(calls) == n:
            break
    return calls


def _args(args: Args) -> str:
    return ", ".join(repr(a) for a in args)
