"""Judged group rewards: a judge model compares two answers at a time.

``pairwise_judge`` compares every pair of the group (N(N-1)/2 comparisons) and scores each
answer by its share of wins; ``tournament_judge`` runs one single-elimination bracket
(N - 1 comparisons, O(N)) and scores each answer by the rounds it won over the rounds of
the bracket (the winner 1.0). With ``swap`` (the default) every comparison is asked in
both orders and a win counts half each time, so a judge that prefers the first position
gives every answer the same share. The judge is the ``judge`` option
(:class:`~streamrl.rollout.rewards.judges.JudgeSpec`: a URL, a frozen model in streamrl's
engine, or the policy); the comparisons the scores need at once (every pair; a
tournament's round) go to it as one batch. A reply that names neither ``A`` nor ``B``
raises ``ValueError``: the guard counts the group reward's failure.

>>> parse_verdict("B is better"), parse_verdict("Response A.")
(1, 0)
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from streamrl.core.types import Item
from streamrl.rollout.rewards import judges
from streamrl.rollout.rewards.group import group_reward
from streamrl.rollout.rewards.judges import JudgeSpec, judge_backend
from streamrl.rollout.rewards.reward_model import check_template, plain_prompt

PAIR_TEMPLATE = (
    "Which response answers the task better? Reply with the letter A or B only.\n"
    "Task: {prompt}\nResponse A: {a}\nResponse B: {b}\nBetter:"
)
_VERDICT = re.compile(r"\b([AB])\b")

# a batch of comparisons (answer shown as A, as B) -> 0 (A wins) or 1 (B) for each
Judge = Callable[[Sequence[tuple[str, str]]], list[int]]


def parse_verdict(text: str) -> int:
    """0 when the judge's ``text`` names A first, 1 for B; ValueError for neither."""
    found = _VERDICT.search(text)
    if found is None:
        raise ValueError(f"judge output names neither A nor B: {text[:200]!r}")
    return 0 if found.group(1) == "A" else 1


def backend_judge(spec: JudgeSpec, template: str, item: Item) -> Judge:
    """Comparisons of answers to ``item`` asked of ``spec``'s backend, one batch a call."""
    backend = judge_backend(spec)
    prompt = plain_prompt(item)

    def judge(pairs: Sequence[tuple[str, str]]) -> list[int]:
        replies = backend.ask([template.format(prompt=prompt, a=a, b=b) for a, b in pairs])
        return [parse_verdict(r) for r in replies]

    return judge


def first_wins(judge: Judge, pairs: Sequence[tuple[str, str]], swap: bool) -> list[float]:
    """How much each pair's first answer beats its second: 1, 0, or with ``swap`` 0.5
    for a split verdict (both orders asked in one batch)."""
    asked = [*pairs, *((b, a) for a, b in pairs)] if swap else list(pairs)
    verdicts = judge(asked)
    n = len(pairs)
    won = [float(v == 0) for v in verdicts[:n]]
    if not swap:
        return won
    return [(w + float(v == 1)) / 2 for w, v in zip(won, verdicts[n:], strict=True)]


def pairwise_scores(answers: Sequence[str], judge: Judge, swap: bool) -> list[float]:
    """Each answer's share of wins over every other answer."""
    n = len(answers)
    ij = [(i, j) for i in range(n) for j in range(i + 1, n)]
    wins = [0.0] * n
    if ij:
        shares = first_wins(judge, [(answers[i], answers[j]) for i, j in ij], swap)
        for (i, j), p in zip(ij, shares, strict=True):
            wins[i], wins[j] = wins[i] + p, wins[j] + 1 - p
    return [w / (n - 1) for w in wins] if n > 1 else [0.0] * n


def tournament_scores(answers: Sequence[str], judge: Judge, swap: bool) -> list[float]:
    """Rounds won in a single-elimination bracket in sample order (a bye advances the
    odd one out; a split verdict advances the earlier answer), over the bracket's rounds.
    Each round's matches are one batch."""
    n = len(answers)
    rounds = math.ceil(math.log2(n)) if n > 1 else 0
    won, alive = [0] * n, list(range(n))
    while len(alive) > 1:
        matches = [(alive[k], alive[k + 1]) for k in range(0, len(alive) - 1, 2)]
        shares = first_wins(judge, [(answers[i], answers[j]) for i, j in matches], swap)
        nxt = [i if p >= 0.5 else j for (i, j), p in zip(matches, shares, strict=True)]
        for winner in nxt:
            won[winner] += 1
        if len(alive) % 2:
            won[alive[-1]] += 1  # the bye
            nxt.append(alive[-1])
        alive = nxt
    return [w / rounds for w in won] if rounds else [0.0] * n


def pairwise_judge(
    completions: Sequence[str],
    item: Item,
    judge: JudgeSpec,
    template: str = PAIR_TEMPLATE,
    swap: bool = True,
) -> list[float]:
    """Each answer's share of wins in every pairwise comparison ``judge`` makes (both
    orders with ``swap``). O(N²) comparisons, asked as one batch."""
    return pairwise_scores(list(completions), backend_judge(judge, template, item), swap)


def tournament_judge(
    completions: Sequence[str],
    item: Item,
    judge: JudgeSpec,
    template: str = PAIR_TEMPLATE,
    swap: bool = True,
) -> list[float]:
    """Rounds won in one single-elimination bracket that ``judge`` decides, over the
    bracket's rounds: N - 1 comparisons (twice that with ``swap``), a batch per round."""
    return tournament_scores(list(completions), backend_judge(judge, template, item), swap)


def setup(options: dict[str, Any], load: bool) -> None:
    """Check the judge (:func:`~streamrl.rollout.rewards.judges.setup`) and the template."""
    judges.setup(options, load)
    check_template(options.get("template", PAIR_TEMPLATE), ("prompt", "a", "b"))


ARENA_REWARDS = {
    "pairwise_judge": group_reward(pairwise_judge),
    "tournament_judge": group_reward(tournament_judge),
}
