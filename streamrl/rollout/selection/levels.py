"""A task's difficulty level, moved by the success rate it measures, and the bandit over
a mixture's tasks (SEC-style): the two controllers of the curriculum sampler
(:mod:`streamrl.rollout.selection.curriculum`). Both are plain state machines, fed one
finished group at a time in item order, so their decisions are a function of the
outcomes and nothing else.

Level. A task starts at ``start_level``. Each finished group of the current level adds
its successes and samples to the level's *window*; once the window holds ``min_groups *
need`` groups, its success rate decides: above the band's high end the level goes up,
below its low end down (within the task's levels), else it stays and the window goes
on. A move empties the window. Hysteresis: a move that reverses the previous one
multiplies ``need`` by ``backoff`` (at most ``max_backoff``); a move in the same
direction resets it to 1. A policy that sits on the boundary between two levels thus
moves between them ever more slowly instead of every ``min_groups`` groups.

>>> c = LevelController(levels=3, band=(0.2, 0.8), min_groups=2)
>>> [c.observe(0, successes=4, samples=4) for _ in range(2)]  # the second moves it up
[0, 1]
>>> c.level, c.moves
(1, 1)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class LevelController:
    """One task's level (see the module docstring)."""

    levels: int
    band: tuple[float, float] = (0.2, 0.8)
    min_groups: int = 8
    backoff: float = 2.0
    max_backoff: float = 16.0
    level: int = 0
    need: float = 1.0  # the multiplier of min_groups the next move needs
    last_move: int = 0  # +1 up, -1 down, 0 none yet
    moves: int = 0
    window: list[int] = field(default_factory=lambda: [0, 0, 0])  # successes, samples, groups
    per_level: dict[int, list[int]] = field(default_factory=dict)  # level -> the same, all

    def observe(self, level: int, successes: int, samples: int) -> int:
        """A group of ``level`` ended with ``successes`` of ``samples``; returns the move
        it caused (+1, -1 or 0). Groups of another level than the current one (issued
        before a move) count in their level's totals only."""
        totals = self.per_level.setdefault(level, [0, 0, 0])
        for i, v in enumerate((successes, samples, 1)):
            totals[i] += v
        if level != self.level or samples == 0:
            return 0
        for i, v in enumerate((successes, samples, 1)):
            self.window[i] += v
        if self.window[2] < math.ceil(self.min_groups * self.need):
            return 0
        rate = self.window[0] / self.window[1]
        low, high = self.band
        move = 1 if rate > high else -1 if rate < low else 0
        if not 0 <= self.level + move < self.levels:
            move = 0
        if move:
            self.need = (
                min(self.need * self.backoff, self.max_backoff) if move == -self.last_move else 1.0
            )
            self.level += move
            self.last_move = move
            self.moves += 1
            self.window = [0, 0, 0]
        return move

    def success(self, level: int | None = None) -> float | None:
        """The success rate measured at ``level`` (the current one by default), all its
        groups together; None before any."""
        s, n, _ = self.per_level.get(self.level if level is None else level, [0, 0, 0])
        return s / n if n else None

    def state(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "need": self.need,
            "last_move": self.last_move,
            "moves": self.moves,
            "window": list(self.window),
            "per_level": {k: list(v) for k, v in self.per_level.items()},
        }

    def load(self, state: dict[str, Any]) -> None:
        self.level, self.need = state["level"], state["need"]
        self.last_move, self.moves = state["last_move"], state["moves"]
        self.window = list(state["window"])
        self.per_level = {int(k): list(v) for k, v in state["per_level"].items()}


@dataclass
class TaskBandit:
    """A Boltzmann bandit over a mixture's tasks (SEC): arm k is drawn with probability
    (1 - exploration) * softmax(Q / temperature + log weight)_k + exploration * weight_k
    (weights normalised), and each finished group of arm k moves Q_k toward its reward:
    Q_k <- (1 - lr) Q_k + lr * reward.

    Rewards (``reward``): 'advantage', the mean |r - mean r| of the group's rewards (0 for
    an all-equal group, 1/2 for a half-right 0/1 group); 'progress', |fast - slow| of two
    moving averages of the arm's success rate (rates lr and lr / 5): large while the
    success rate moves, either way, 0 once it settles.

    >>> b = TaskBandit([1.0, 1.0], temperature=0.1)
    >>> for _ in range(20):
    ...     b.observe(0, [1.0, 0.0, 1.0, 0.0], 2)
    ...     b.observe(1, [0.0, 0.0, 0.0, 0.0], 0)
    >>> [round(p, 3) for p in b.probabilities()]
    [0.968, 0.032]
    """

    weights: list[float]
    temperature: float = 0.1
    lr: float = 0.2
    exploration: float = 0.05
    reward: str = "advantage"
    q: list[float] = field(default_factory=list)
    fast: list[float | None] = field(default_factory=list)
    slow: list[float | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.weights)
        self.q = self.q or [0.0] * n
        self.fast = self.fast or [None] * n
        self.slow = self.slow or [None] * n

    def probabilities(self) -> list[float]:
        total = sum(self.weights)
        prior = [w / total for w in self.weights]
        logits = [q / self.temperature + math.log(p) for q, p in zip(self.q, prior, strict=True)]
        top = max(logits)
        exp = [math.exp(x - top) for x in logits]
        z = sum(exp)
        return [
            (1.0 - self.exploration) * e / z + self.exploration * p
            for e, p in zip(exp, prior, strict=True)
        ]

    def choose(self, u: float) -> int:
        """The arm a uniform draw ``u`` in [0, 1) picks."""
        acc = 0.0
        probs = self.probabilities()
        for k, p in enumerate(probs):
            acc += p
            if u < acc:
                return k
        return len(probs) - 1

    def observe(self, arm: int, rewards: list[float], successes: int) -> None:
        if not rewards:
            return
        if self.reward == "advantage":
            mean = sum(rewards) / len(rewards)
            gain = sum(abs(r - mean) for r in rewards) / len(rewards)
        else:
            rate = successes / len(rewards)
            fast, slow = self.fast[arm], self.slow[arm]
            self.fast[arm] = rate if fast is None else (1 - self.lr) * fast + self.lr * rate
            slow_lr = self.lr / 5
            self.slow[arm] = rate if slow is None else (1 - slow_lr) * slow + slow_lr * rate
            gain = abs(self.fast[arm] - self.slow[arm])
        self.q[arm] = (1.0 - self.lr) * self.q[arm] + self.lr * gain

    def state(self) -> dict[str, Any]:
        return {"q": list(self.q), "fast": list(self.fast), "slow": list(self.slow)}

    def load(self, state: dict[str, Any]) -> None:
        self.q, self.fast, self.slow = list(state["q"]), list(state["fast"]), list(state["slow"])
