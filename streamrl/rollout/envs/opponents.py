"""Scripted players for the seats the policy does not play: fixed opponents to measure
a policy against, and teachers whose moves a supervised warm-start imitates.

An opponent is ``fn(conversation, actions, rng) -> str``: the messages its seat has seen
so far, the actions the environment lists as legal now (``Observation.actions``) and a
random generator seeded by the episode; it returns its move as text. Register one with
``@register_opponent("name")``; an item's ``metadata["seats"]`` names each seat's player
(``policy``, or an opponent's name).

>>> import random
>>> conversation = [{"role": "user", "content": "Your card is: 'K'"}]
>>> get_opponent("kuhn_heuristic")(conversation, ("[check]", "[bet]"), random.Random(0))
'[bet]'
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

Opponent = Callable[[list[dict[str, str]], tuple[str, ...], random.Random], str]
_OPPONENTS: dict[str, Opponent] = {}
POLICY = "policy"  # the seat the trained policy plays


def register_opponent(name: str) -> Callable[[Opponent], Opponent]:
    def decorator(fn: Opponent) -> Opponent:
        if name == POLICY or (name in _OPPONENTS and _OPPONENTS[name] is not fn):
            raise ValueError(f"opponent {name!r} is already registered")
        _OPPONENTS[name] = fn
        return fn

    return decorator


def opponent_names() -> list[str]:
    return sorted(_OPPONENTS)


def get_opponent(name: str) -> Opponent:
    if name not in _OPPONENTS:
        raise ValueError(
            f"unknown player {name!r} for a seat; known: {POLICY}, {', '.join(opponent_names())}"
        )
    return _OPPONENTS[name]


@register_opponent("random")
def random_opponent(conversation: list[dict], actions: tuple[str, ...], rng: random.Random) -> str:
    """A legal action uniformly at random (an empty move when none is listed)."""
    return rng.choice(actions) if actions else ""


_KUHN_CARD = re.compile(r"[Yy]our card is:? '?([JQK])'?")


@register_opponent("kuhn_heuristic")
def kuhn_heuristic(conversation: list[dict], actions: tuple[str, ...], rng: random.Random) -> str:
    """Kuhn Poker by card strength: a King bets and calls, a Queen checks and calls, a
    Jack checks and folds (the card is the last one dealt to this seat)."""
    cards = _KUHN_CARD.findall(" ".join(m["content"] for m in conversation))
    card = cards[-1] if cards else "Q"
    wanted = {
        "K": ("[bet]", "[call]"),
        "Q": ("[check]", "[call]"),
        "J": ("[check]", "[fold]"),
    }[card]
    legal = {a.lower(): a for a in actions}
    for move in wanted:
        if move in legal:
            return legal[move]
    return random_opponent(conversation, actions, rng)
