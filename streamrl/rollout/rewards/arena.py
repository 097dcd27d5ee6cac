"""Judged group rewards: a judge model compares two answers at a time.

``pairwise_judge`` compares every pair of the group (N(N-1)/2 comparisons) and scores each
answer by its share of wins; ``tournament_judge`` runs one single-elimination bracket
(N - 1 comparisons, O(N)) and scores each answer by the rounds it won over the rounds of
the bracket (the winner 1.0). With ``swap`` (the default) every comparison is asked in
both orders and a win counts half each time, so a judge that prefers the first position
gives every answer the same share. The judge is an OpenAI-compatible chat endpoint at
``url`` (``streamrl serve`` of a frozen copy, vLLM, any server; tests use loopback).
An answer the judge gives that names neither ``A`` nor ``B`` raises ``ValueError``: the
guard counts the group reward's failure.

>>> parse_verdict("B is better"), parse_verdict("Response A.")
(1, 0)
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import httpx

from streamrl.core.types import Item
from streamrl.rollout.rewards.group import group_reward

PAIR_TEMPLATE = (
    "Which response answers the task better? Reply with the letter A or B only.\n"
    "Task: {prompt}\nResponse A: {a}\nResponse B: {b}\nBetter:"
)
_VERDICT = re.compile(r"\b([AB])\b")

Judge = Callable[[str, str], int]  # (answer shown as A, as B) -> 0 (A wins) or 1 (B)


def parse_verdict(text: str) -> int:
    """0 when the judge's ``text`` names A first, 1 for B; ValueError for neither."""
    found = _VERDICT.search(text)
    if found is None:
        raise ValueError(f"judge output names neither A nor B: {text[:200]!r}")
    return 0 if found.group(1) == "A" else 1


def url_judge(
    url: str, model: str, template: str, item: Item, api_key: str, timeout_s: float
) -> Judge:
    """A judge asked through ``url``'s ``/chat/completions`` (greedy, a few tokens)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def judge(a: str, b: str) -> int:
        text = template.format(prompt=item.prompt, a=a, b=b)
        messages = [{"role": "user", "content": text}]
        body = {"model": model, "messages": messages, "max_tokens": 8, "temperature": 0.0}
        endpoint = f"{url.rstrip('/')}/chat/completions"
        reply = httpx.post(endpoint, json=body, headers=headers, timeout=timeout_s)
        reply.raise_for_status()
        return parse_verdict(reply.json()["choices"][0]["message"]["content"] or "")

    return judge


def first_wins(judge: Judge, a: str, b: str, swap: bool) -> float:
    """How much ``a`` beats ``b``: 1, 0, or with ``swap`` 0.5 for a split verdict."""
    won = float(judge(a, b) == 0)
    return (won + float(judge(b, a) == 1)) / 2 if swap else won


def pairwise_scores(answers: Sequence[str], judge: Judge, swap: bool) -> list[float]:
    """Each answer's share of wins over every other answer."""
    n = len(answers)
    wins = [0.0] * n
    for i in range(n):
        for j in range(i + 1, n):
            p = first_wins(judge, answers[i], answers[j], swap)
            wins[i], wins[j] = wins[i] + p, wins[j] + 1 - p
    return [w / (n - 1) for w in wins] if n > 1 else [0.0] * n


def tournament_scores(answers: Sequence[str], judge: Judge, swap: bool) -> list[float]:
    """Rounds won in a single-elimination bracket in sample order (a bye advances the
    odd one out; a split verdict advances the earlier answer), over the bracket's rounds."""
    n = len(answers)
    rounds = math.ceil(math.log2(n)) if n > 1 else 0
    won, alive = [0] * n, list(range(n))
    while len(alive) > 1:
        nxt = []
        for k in range(0, len(alive) - 1, 2):
            i, j = alive[k], alive[k + 1]
            winner = i if first_wins(judge, answers[i], answers[j], swap) >= 0.5 else j
            won[winner] += 1
            nxt.append(winner)
        if len(alive) % 2:
            won[alive[-1]] += 1  # the bye
            nxt.append(alive[-1])
        alive = nxt
    return [w / rounds for w in won] if rounds else [0.0] * n


def pairwise_judge(
    completions: Sequence[str],
    item: Item,
    url: str = "",
    model: str = "judge",
    template: str = PAIR_TEMPLATE,
    swap: bool = True,
    api_key: str = "",
    timeout_s: float = 30.0,
) -> list[float]:
    """Each answer's share of wins in every pairwise comparison the judge at ``url``
    makes (both orders with ``swap``). O(N²) comparisons."""
    judge = url_judge(url, model, template, item, api_key, timeout_s)
    return pairwise_scores(list(completions), judge, swap)


def tournament_judge(
    completions: Sequence[str],
    item: Item,
    url: str = "",
    model: str = "judge",
    template: str = PAIR_TEMPLATE,
    swap: bool = True,
    api_key: str = "",
    timeout_s: float = 30.0,
) -> list[float]:
    """Rounds won in one single-elimination bracket judged at ``url``, over the bracket's
    rounds: N - 1 comparisons (twice that with ``swap``)."""
    judge = url_judge(url, model, template, item, api_key, timeout_s)
    return tournament_scores(list(completions), judge, swap)


ARENA_REWARDS = {
    "pairwise_judge": group_reward(pairwise_judge),
    "tournament_judge": group_reward(tournament_judge),
}
