"""TextArena games as a task source (``data.kind: textarena``, ``rollout.episode: env``).

An item is one game of ``env_id`` (any registered TextArena id, e.g. ``KuhnPoker-v0``,
``TicTacToe-v0``), reset with the item's seed. By default the policy plays every seat
(self-play: one trajectory per seat); ``seats`` names the players otherwise. Held-out
items are games of the policy against each of ``eval_opponents`` (scripted players:
``random``, ``kuhn_heuristic``, ...), the policy's seat alternating, tagged with the
domain ``vs_<opponent>``: evaluation reports the win rate against each
(``eval/accuracy/vs_random`` with ``reward.correct_reward: env_win``).

Options:
    env_id:          a TextArena id (its unwrapped version is played)
    env_options:     keyword arguments of the game (``{max_rounds: 1}``)
    players:         the game's number of players
    seats:           who plays each seat in training (default: the policy in all)
    eval_opponents:  the opponents of the held-out games
    observe:         the TextArena message types a seat sees (default: all of them;
                     ``prompt`` is the rules, ``player_action`` the others' raw moves)
    demonstration:   an opponent whose moves, played in the policy seats, are the
                     supervised warm-start's demonstrations (``sft.steps > 0``)
    invalid_move_penalty: subtracted from the return of a seat whose invalid move ended
                     the game (TextArena scores it as a plain loss, no worse than a legal
                     losing move: a seat that loses anyway has no reason to stay legal)
    heldout_size:    held-out games (all opponents together)

TextArena games draw from Python's global ``random``; each game keeps its own
generator state (:func:`isolated_random`), so a game depends on its seed alone, whatever
other games run beside it.

>>> src = TextArenaTaskSource("KuhnPoker-v0", env_options={"max_rounds": 1})
>>> item = next(src.train_iter(0))
>>> item.metadata["env"]["id"], item.metadata["seats"]
('KuhnPoker-v0', ['policy', 'policy'])
>>> [it.metadata["domain"] for it in src.heldout(2)]
['vs_random', 'vs_random']
"""

from __future__ import annotations

import contextlib
import itertools
import random
import threading
from collections.abc import Iterator
from typing import Any

from streamrl.core.types import Item
from streamrl.sources.base import TaskSource
from streamrl.sources.environments import env_item, require

KIND = "textarena"
_RANDOM = threading.Lock()  # one TextArena call at a time, each with its own random state
POLICY = "policy"
EVAL_SEED = 1_000_000  # held-out games' seeds start here (training's come from its seed)


@contextlib.contextmanager
def isolated_random(state: list[Any]) -> Iterator[None]:
    """Run with Python's global ``random`` set to ``state[0]`` (a fresh generator when
    None), store the state it ends in back there, and restore the global one."""
    with _RANDOM:
        saved = random.getstate()
        if state[0] is not None:
            random.setstate(state[0])
        try:
            yield
        finally:
            state[0] = random.getstate()
            random.setstate(saved)


def observation_types(observe: list[str] | None) -> list[str]:
    """The TextArena message type names a seat sees, validated."""
    ta = require("textarena", KIND)
    known = [t.name.lower() for t in ta.ObservationType]
    chosen = known if observe is None else [o.lower() for o in observe]
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        raise ValueError(f"observe: unknown message types {unknown}; known: {known}")
    return chosen


def make_game(env_id: str, env_options: dict[str, Any]) -> Any:
    """The unwrapped game (the ``-raw`` registration when TextArena has one)."""
    ta = require("textarena", KIND)
    registry = ta.envs.registration.ENV_REGISTRY
    name = env_id if env_id.endswith("-raw") or f"{env_id}-raw" not in registry else f"{env_id}-raw"
    if name not in registry:
        raise ValueError(f"env_id={env_id!r} is not a registered TextArena game")
    try:
        return ta.make(name, **env_options)
    except TypeError as e:
        raise ValueError(f"env_options for {env_id!r}: {e}") from None


class TextArenaTaskSource(TaskSource):
    def __init__(
        self,
        env_id: str,
        env_options: dict[str, Any] | None = None,
        players: int = 2,
        seats: list[str] | None = None,
        eval_opponents: list[str] | None = None,
        observe: list[str] | None = None,
        demonstration: str | None = None,
        heldout_size: int = 200,
        invalid_move_penalty: float = 0.0,
    ) -> None:
        if players < 1 or heldout_size < 1:
            raise ValueError("players and heldout_size must be >= 1")
        if invalid_move_penalty < 0:
            raise ValueError("invalid_move_penalty must be >= 0")
        self.seats = list(seats) if seats is not None else [POLICY] * players
        if len(self.seats) != players or POLICY not in self.seats:
            raise ValueError(f"seats must name {players} players, the policy among them")
        self.opponents = list(eval_opponents or ["random"])
        self.spec = {
            "kind": KIND,
            "id": env_id,
            "options": dict(env_options or {}),
            "players": players,
            "observe": observation_types(observe),
            "invalid_move_penalty": float(invalid_move_penalty),
        }
        self.demonstration, self.heldout_size = demonstration, heldout_size
        game, state = make_game(env_id, self.spec["options"]), [None]
        try:  # the id, options and number of players are checked now, not in every episode
            with isolated_random(state):
                game.reset(num_players=players, seed=0)
        except (AssertionError, TypeError, ValueError) as e:
            raise ValueError(f"{env_id} cannot be played by {players} players: {e}") from None

    def train_iter(self, seed: int) -> Iterator[Item]:
        rng = random.Random(seed)
        extra = {} if self.demonstration is None else {"demonstration": self.demonstration}
        for k in itertools.count():
            name = f"{self.spec['id']}:game-{k}"
            item = env_item(name, self.spec, rng.getrandbits(31), self.seats, **extra)
            if self.demonstration is not None:
                item.answer = ""  # (the supervised warm-start takes items with an answer)
            yield item

    def heldout(self, n: int | None = None) -> list[Item]:
        """Game k: the policy against ``eval_opponents[k % len]`` in seat
        ``(k // len) % players``, the others played by that opponent."""
        items, players = [], self.spec["players"]
        for k in range(self.heldout_size if n is None else n):
            opponent = self.opponents[k % len(self.opponents)]
            seat = (k // len(self.opponents)) % players
            seats = [POLICY if s == seat else opponent for s in range(players)]
            name, domain = f"{self.spec['id']}:eval-{k}", f"vs_{opponent}"
            items.append(env_item(name, self.spec, EVAL_SEED + k, seats, domain=domain))
        return items
