"""Procedural arithmetic problems: ``12+34=`` -> ``46``.

Operands are uniform in ``[0, 10**digits)``; the expression is evaluated with the
usual precedence (``*`` before ``+``/``-``), so answers may be negative.

Train and held-out splits are disjoint by construction: a problem is held out iff
a stable hash of its canonical string (``"12+34"``) falls in the bucket covering
``heldout_fraction`` of hash space. Training samples reject held-out problems, and
the held-out list is drawn (with a fixed seed) only from that bucket. When the
problem space is small the held-out list may hold fewer than ``heldout_size``
problems (it then holds every held-out problem).

Difficulty: ``digits`` levels, level L drawing operands of up to L + 1 digits (the top
level is the task as configured); the held-out split is always the configured task.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Literal

from streamrl.core.types import Item
from streamrl.sources.base import LEVEL_KEY, TaskSource, in_heldout

CHAT_TEMPLATE = "What is {expr}? Reply with only the number."
_HELDOUT_SEED = "streamrl-arithmetic-heldout"


def evaluate(operands: list[int], operators: list[str]) -> int:
    """Value of ``operands[0] op0 operands[1] op1 ...`` with ``*`` binding tighter.

    >>> evaluate([2, 3, 4], ["+", "*"])
    14
    >>> evaluate([5, 7], ["-"])
    -2
    """
    terms, signs = [operands[0]], [1]
    for op, x in zip(operators, operands[1:], strict=True):
        if op == "*":
            terms[-1] *= x
        else:
            terms.append(x)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms, strict=True))


class ArithmeticTaskSource(TaskSource):
    """Endless arithmetic problems with a fixed, disjoint held-out split.

    Args:
        digits: maximum number of digits per operand (operands in ``[0, 10**digits)``).
        operators: the operators to draw from, a subset of ``"+-*"``.
        num_operands: operands per problem (>= 2).
        format: ``"plain"`` (``prompt="12+34="``) or ``"chat"`` (one user message,
            ``"What is 12 + 34? Reply with only the number."``).
        heldout_size: how many held-out problems ``heldout()`` returns at most.
        heldout_fraction: share of the problem space reserved for held-out.
    """

    task_name = "arithmetic"

    def __init__(
        self,
        digits: int = 2,
        operators: str = "+-",
        num_operands: int = 2,
        format: Literal["plain", "chat"] = "plain",
        heldout_size: int = 200,
        heldout_fraction: float = 0.05,
    ) -> None:
        if digits < 1:
            raise ValueError(f"digits must be >= 1, got {digits}")
        if not operators or set(operators) - set("+-*"):
            raise ValueError(f"operators must be a non-empty subset of '+-*', got {operators!r}")
        if num_operands < 2:
            raise ValueError(f"num_operands must be >= 2, got {num_operands}")
        if format not in ("plain", "chat"):
            raise ValueError(f"format must be 'plain' or 'chat', got {format!r}")
        if not 0.0 < heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        if heldout_size < 0:
            raise ValueError(f"heldout_size must be >= 0, got {heldout_size}")
        self.digits = digits
        self.operators = sorted(set(operators))
        self.num_operands = num_operands
        self.format = format
        self.heldout_size = heldout_size
        self.heldout_fraction = heldout_fraction
        self._heldout: list[Item] | None = None

    @property
    def levels(self) -> int:
        """One level per operand length: level L draws operands of up to L + 1 digits."""
        return self.digits

    def _sample(self, rng: random.Random, digits: int | None = None) -> tuple[list[int], list[str]]:
        hi = 10 ** (digits or self.digits) - 1
        operands = [rng.randint(0, hi) for _ in range(self.num_operands)]
        ops = [rng.choice(self.operators) for _ in range(self.num_operands - 1)]
        return operands, ops

    def is_heldout(self, operands: list[int], operators: list[str]) -> bool:
        """Whether this problem belongs to the held-out split."""
        return in_heldout(_canonical(operands, operators), self.heldout_fraction)

    def make_item(self, operands: list[int], operators: list[str]) -> Item:
        """The item for one problem (same id in both splits' namespaces: ``arith:<expr>``)."""
        expr = _canonical(operands, operators)
        if self.format == "plain":
            prompt, messages = f"{expr}=", None
        else:
            spaced = _canonical(operands, operators, sep=" ")
            content = CHAT_TEMPLATE.format(expr=spaced)
            prompt, messages = None, [{"role": "user", "content": content}]
        return Item(
            id=f"arith:{expr}",
            prompt=prompt,
            messages=messages,
            answer=str(evaluate(operands, operators)),
            metadata={"operands": list(operands), "operators": list(operators), "expression": expr},
        )

    def train_iter(self, seed: int) -> Iterator[Item]:
        rng = random.Random(seed)
        level = self.level
        digits = None if level is None else level + 1
        rejected_in_a_row = 0
        while True:
            operands, ops = self._sample(rng, digits)
            if self.is_heldout(operands, ops):
                rejected_in_a_row += 1
                if rejected_in_a_row > 10_000:  # unreachable unless the space is ~all held out
                    raise RuntimeError("arithmetic: cannot draw a training problem")
                continue
            rejected_in_a_row = 0
            item = self.make_item(operands, ops)
            if level is not None:
                item.metadata[LEVEL_KEY] = level
            yield item

    def heldout(self, n: int | None = None) -> list[Item]:
        if self._heldout is None:
            self._heldout = [self.make_item(*p) for p in self._heldout_problems()]
        items = self._heldout if n is None else self._heldout[:n]
        return [self.make_item(it.metadata["operands"], it.metadata["operators"]) for it in items]

    def _heldout_problems(self) -> list[tuple[list[int], list[str]]]:
        """Held-out problems in a fixed order (deterministic for the source's options)."""
        rng = random.Random(_HELDOUT_SEED)
        n_ops = self.num_operands - 1
        size = 10 ** (self.digits * self.num_operands) * len(self.operators) ** n_ops
        # Enumerate when held-out problems are scarce (sampling could not find enough).
        if size * self.heldout_fraction < 4 * self.heldout_size:
            values = range(10**self.digits)
            problems = [
                (list(xs), list(ops))
                for xs in itertools.product(values, repeat=self.num_operands)
                for ops in itertools.product(self.operators, repeat=self.num_operands - 1)
                if self.is_heldout(list(xs), list(ops))
            ]
            rng.shuffle(problems)
            return problems[: self.heldout_size]
        seen: set[str] = set()
        problems = []
        for _ in range(1000 * self.heldout_size):  # ~heldout_size / fraction draws needed
            if len(problems) >= self.heldout_size:
                break
            operands, ops = self._sample(rng)
            key = _canonical(operands, ops)
            if key not in seen and self.is_heldout(operands, ops):
                seen.add(key)
                problems.append((operands, ops))
        return problems


def _canonical(operands: list[int], operators: list[str], sep: str = "") -> str:
    """``"12+34"`` (the split key), or ``"12 + 34"`` with ``sep=" "``."""
    parts = [str(operands[0])]
    for op, x in zip(operators, operands[1:], strict=True):
        parts += [op, str(x)]
    return sep.join(parts)
