"""TextArena games through the text-environment protocol (``env.kind: textarena``).

A seat's observation is the messages TextArena has for it since its last turn, of the
types ``observe`` keeps, one user message: the game's own lines as they are, another
player's raw move as ``[Player k] move``. A seat's own moves are left out (they are
already its assistant turns). The legal actions are the quoted bracketed moves the game
lists (``'[check]', '[bet]'``), whether or not the seat sees that message. Rewards come at the end: each player's outcome (+1 won,
-1 lost, 0 drawn). Every call runs on a thread with the game's own random state
(:func:`streamrl.sources.textarena.isolated_random`).
"""

from __future__ import annotations

import re
from typing import Any

from streamrl.rollout.envs.base import Action, Observation, Step, in_thread
from streamrl.rollout.envs.registry import register_env
from streamrl.sources.textarena import isolated_random, make_game

_LEGAL = re.compile(r"'(\[[^\]'\n]{1,40}\])'")


def legal_actions(texts: list[str]) -> tuple[str, ...]:
    """The quoted bracketed moves of the last text that lists any.

    >>> legal_actions(["Your card is: 'K'", "Your available actions are: '[check]', '[bet]'"])
    ('[check]', '[bet]')
    """
    for text in reversed(texts):
        found = _LEGAL.findall(text)
        if found:
            return tuple(dict.fromkeys(found))
    return ()


class TextArenaEnv:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.seats = int(spec["players"])
        self.observe = set(spec["observe"])
        self.penalty = float(spec.get("invalid_move_penalty", 0.0))
        self.game = make_game(spec["id"], spec.get("options", {}))
        self.random: list[Any] = [None]  # this game's generator state

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        with isolated_random(self.random):
            return fn(*args, **kwargs)

    def _observe(self) -> Observation:
        seat, messages = self._call(self.game.get_observation)
        others = [(sender, text, kind) for sender, text, kind in messages if sender != seat]
        texts = [
            text if sender < 0 else f"[Player {sender}] {text}"
            for sender, text, kind in others
            if kind.name.lower() in self.observe
        ]
        content = "\n".join(texts)
        legal = legal_actions([text for _, text, _ in others])  # (listed, seen or not)
        return Observation([{"role": "user", "content": content}], int(seat), legal)

    async def reset(self, seed: int) -> Observation:
        await in_thread(self._call, self.game.reset, num_players=self.seats, seed=seed)
        return await in_thread(self._observe)

    async def step(self, action: Action) -> Step:
        done, info = await in_thread(self._call, self.game.step, action.text)
        if done:
            rewards, game_info = await in_thread(self._call, self.game.close)
            outcome = {int(s): float(r) for s, r in (rewards or {}).items()}
            for s, seat_info in (game_info or {}).items():  # the seat whose move was invalid
                if self.penalty and (seat_info or {}).get("invalid_move") and int(s) in outcome:
                    outcome[int(s)] -= self.penalty
            return Step(None, outcome, True, {"game_info": game_info})
        return Step(await in_thread(self._observe), {}, False, dict(info or {}))

    async def close(self) -> None:
        return None


@register_env("textarena")
def _textarena(spec: dict[str, Any]) -> TextArenaEnv:
    return TextArenaEnv(spec)
