"""The environment episode (``rollout.episode: env``): a text environment played turn by
turn, token in, token out, by one policy in one or more seats.

Each seat the policy plays keeps its own conversation and tokens, built as the agent
episode builds them (:mod:`streamrl.rollout.episodes.agent`): the first observation is
the chat template's rendering of the seat's messages; each later one is the text the
template adds between the seat's turn as generated and its next generation prompt.
Observation tokens are masked (version -1); generated tokens keep their log-probs and
weight versions. The other seats are played by scripted opponents
(:mod:`streamrl.rollout.envs.opponents`) and are not trained on.

An episode returns :class:`~streamrl.rollout.episodes.Trajectories`: one trajectory per
policy seat that took a turn (each with its own versions; the stream bounds the
staleness of every one), scored by the run's reward components with the seat's
environment return in its item (``env_return``, ``env_win``). Each trajectory's
metadata holds its turns (``turn_spans``: token ranges), their rewards
(``turn_rewards``, summing to the trajectory's reward), their states (``turn_keys``) and
its role (``role_key``: game and seat), for turn-level and role-conditioned credit.

The episode ends when the environment says so; at ``env.max_turns`` turns without an
end, or when the environment raises, hangs past ``env.step_timeout_s``, returns a
malformed observation or a non-finite reward, it ends without trajectories, counted
(``env/errors/<kind>``), and the rest of the group goes on. A seat whose next
observation would not fit ``env.max_total_tokens`` ends the episode the same way
(``env/truncated``): an episode without its outcome is not trained on (a reward of 0 for
it would teach a losing seat to run out of tokens).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from streamrl.core.engine import InferenceEngine
from streamrl.core.turns import ROLE_KEY, TURN_KEYS, TURN_REWARDS, TURN_SPANS
from streamrl.core.types import GenerationRequest, Item, SamplingParams, Trajectory
from streamrl.rollout.envs.base import (
    Action,
    EnvError,
    Observation,
    TextEnv,
    check_observation,
    check_step,
    guarded,
)
from streamrl.rollout.envs.opponents import POLICY, Opponent, get_opponent
from streamrl.rollout.envs.registry import ENV_KEY, SEATS_KEY, SEED_KEY, make_env
from streamrl.rollout.envs.rewards import ENV_RESULT
from streamrl.rollout.episodes.agent import (
    ReplayEngine,
    TokenLog,
    observation_text,
    turn_seed,
    turn_text,
)
from streamrl.rollout.episodes.base import (
    EpisodeSpec,
    Trajectories,
    check_room,
    register_episode,
)
from streamrl.rollout.episodes.single_turn import item_params
from streamrl.rollout.rewards import CompositeReward
from streamrl.sources.base import stable_hash


def state_key(obs: Observation) -> str:
    """A short hash of what a seat sees before a turn: turns of one group that start from
    the same observation share it (GiGPO's anchor states)."""
    text = "\x00".join(f"{m['role']}:{m['content']}" for m in obs.messages)
    return hashlib.blake2b(f"{obs.seat}\x01{text}".encode(), digest_size=8).hexdigest()


@dataclass
class Seat:
    """A seat the policy plays: its conversation, its tokens and its turns."""

    messages: list[dict[str, str]] = field(default_factory=list)
    tokens: TokenLog = field(default_factory=TokenLog)
    rendered: str = ""  # G: the conversation rendered up to its next generation prompt
    as_generated: str = ""  # O: its last turn as generated
    spans: list[tuple[int, int]] = field(default_factory=list)  # token range of each turn
    rewards: list[float] = field(default_factory=list)  # the environment's, per turn
    keys: list[str] = field(default_factory=list)  # each turn's state_key
    pending: float = 0.0  # rewards earned before its first turn
    last: str = ""  # its last move
    finish: str = "stop"

    def credit(self, reward: float) -> None:
        """A reward goes to the seat's latest turn (before any turn: to its first)."""
        if self.rewards:
            self.rewards[-1] += reward
        else:
            self.pending += reward


@dataclass(repr=False)  # (a tokenizer's repr is its vocabulary: slow to print)
class EnvEpisode:
    """See the module docstring."""

    tokenizer: Any
    sampling: SamplingParams
    reward: CompositeReward
    max_turns: int = 32
    max_total_tokens: int = 1024
    system_prompt: str | None = None
    step_timeout_s: float = 30.0

    def render(self, messages: list[dict], *, generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def opening(self, messages: list[dict]) -> list[dict]:
        """A seat's first messages, with ``env.system_prompt`` first when one is set."""
        if self.system_prompt and (not messages or messages[0]["role"] != "system"):
            return [{"role": "system", "content": self.system_prompt}, *messages]
        return list(messages)

    async def __call__(
        self, engine: InferenceEngine, item: Item, seed: int, *, greedy: bool = False, **_: Any
    ) -> Trajectories:
        return await self.play(engine, item, seed, item_params(self.sampling, item, greedy))

    async def play(
        self,
        engine: InferenceEngine | None,
        item: Item,
        seed: int,
        params: SamplingParams,
        teacher: Opponent | None = None,
    ) -> Trajectories:
        """One episode; with a ``teacher``, the policy seats play its moves instead of
        the engine's (as if generated: a demonstration for a supervised warm-start)."""
        roles = list(item.metadata.get(SEATS_KEY, [POLICY]))
        seats = {s: Seat() for s, role in enumerate(roles) if role == POLICY}
        metrics: Counter[str] = Counter()
        env: TextEnv | None = None
        try:
            try:
                env = make_env(item.metadata[ENV_KEY])
            except Exception as e:
                raise EnvError("raised", f"building the environment: {e}") from e
            players = _Players(self, engine, item, roles, seats, seed, params, teacher, metrics)
            if not await players.run(env):  # cut by the token budget: no outcome to learn
                metrics["env/truncated"] += 1
                return Trajectories([], dict(metrics), "env_truncated")
        except EnvError as e:
            metrics[f"env/errors/{e.kind}"] += 1
            return Trajectories([], dict(metrics), f"env_error:{e.kind}")
        finally:
            if env is not None:
                await self.close(env, metrics)
        scored = [self.score(item, s, seat) for s, seat in seats.items() if seat.spans]
        trajectories = list(await asyncio.gather(*scored))
        for t in trajectories:
            metrics[f"env/return/seat_{t.metadata['seat']}"] += t.metadata["env_return"]
        return Trajectories(trajectories, dict(metrics))

    async def close(self, env: TextEnv, metrics: Counter[str]) -> None:
        try:
            await guarded(env.close(), self.step_timeout_s, "close")
        except EnvError:
            metrics["env/close_errors"] += 1  # the episode's outcome stands

    async def score(self, item: Item, s: int, seat: Seat) -> Trajectory:
        """The seat's trajectory, scored by the reward components with its return."""
        ret = sum(seat.rewards)
        scored_item = replace(item, metadata={**item.metadata, ENV_RESULT: {"return": ret}})
        scored = await self.reward.ascore(seat.last, scored_item)
        total = scored.total if scored.total is not None else 0.0
        turn_rewards = list(seat.rewards)
        turn_rewards[-1] += total - ret  # shaping components count at the last turn
        spec = item.metadata[ENV_KEY]
        game = str(spec.get("id", spec.get("kind")))
        metadata = {
            "completion": seat.last,
            "messages": seat.messages,
            "finish_reason": seat.finish,
            "reward_components": scored.components,
            "reward_errors": scored.errors,
            "seat": s,
            "env_return": ret,
            ROLE_KEY: f"{game}/seat_{s}",
            TURN_SPANS: list(seat.spans),
            TURN_REWARDS: turn_rewards,
            TURN_KEYS: list(seat.keys),
        }
        t = seat.tokens
        return Trajectory(
            input_ids=torch.tensor(t.ids, dtype=torch.long),
            loss_mask=torch.tensor(t.mask, dtype=torch.bool),
            behavior_logprobs=torch.tensor(t.logprobs, dtype=torch.float32),
            versions=torch.tensor(t.versions, dtype=torch.long),
            reward=total,
            item_index=item.index,
            metadata=metadata,
        )

    def prompt_ids(self, item: Item) -> list[int]:
        """The tokens of the first policy turn's request (for preflight's length check);
        an environment that fails to reset measures as empty (the run counts it)."""

        async def first() -> Observation:
            env = make_env(item.metadata[ENV_KEY])
            try:
                obs = await guarded(env.reset(self.reset_seed(item)), self.step_timeout_s, "reset")
                return check_observation(obs, len(item.metadata.get(SEATS_KEY, [POLICY])))
            finally:
                await self.close(env, Counter())

        try:
            obs = asyncio.run(first())
        except Exception:  # the run counts this environment's failure (env/errors/<kind>)
            return []
        return self.encode(self.render(self.opening(obs.messages)))

    @staticmethod
    def reset_seed(item: Item) -> int:
        return int(item.metadata.get(SEED_KEY, 0))

    def replay(self, item: Item) -> Trajectory:
        """A demonstration: the game played with ``metadata["demonstration"]`` (an
        opponent's name) in the policy seats, one seat's moves as trained-on tokens."""
        teacher = get_opponent(item.metadata["demonstration"])
        params = item_params(self.sampling, item, greedy=True)
        # the teacher's generator is seeded by the item: a random teacher's games differ
        # (one seed for every game made "random" one fixed move per situation)
        seed = self.reset_seed(item) ^ stable_hash(item.id)
        out = asyncio.run(self.play(None, item, seed, params, teacher=teacher))
        if not out.trajectories:
            raise ValueError(f"item {item.id!r}: its demonstration failed: {out.error}")
        return out.trajectories[stable_hash(item.id) % len(out.trajectories)]


@dataclass(repr=False)
class _Players:
    """The turn loop of one episode: who acts, what they see, where rewards go."""

    episode: EnvEpisode
    engine: InferenceEngine | None
    item: Item
    roles: list[str]
    seats: dict[int, Seat]
    seed: int
    params: SamplingParams
    teacher: Opponent | None
    metrics: Counter[str]
    heard: dict[int, list[dict]] = field(default_factory=dict)  # scripted seats' messages

    async def run(self, env: TextEnv) -> bool:
        """Play until the environment ends the episode (True) or a seat's tokens would
        not fit ``env.max_total_tokens`` (False)."""
        ep, n = self.episode, len(self.roles)
        rng = random.Random(self.seed)
        obs = await guarded(env.reset(ep.reset_seed(self.item)), ep.step_timeout_s, "reset")
        obs = check_observation(obs, n)
        for turn in range(ep.max_turns):
            if obs.seat in self.seats:
                action = await self.policy_turn(self.seats[obs.seat], obs, turn, rng)
                if action is None:
                    return False
            else:
                heard = self.heard.setdefault(obs.seat, [])
                heard += obs.messages
                move = get_opponent(self.roles[obs.seat])(heard, obs.actions, rng)
                action = Action(move, obs.seat)
            step = await guarded(env.step(action), ep.step_timeout_s, "step")
            step = check_step(step, n)
            self.metrics["env/turns"] += 1
            for s, r in step.rewards.items():
                if s in self.seats:
                    self.seats[s].credit(float(r))
            if step.done:
                return True
            obs = step.observation
        raise EnvError("max_turns", f"the environment did not end in env.max_turns={ep.max_turns}")

    async def policy_turn(
        self, seat: Seat, obs: Observation, turn: int, rng: random.Random
    ) -> Action | None:
        """The policy's move for ``seat`` (None: its tokens would not fit the budget)."""
        ep, first = self.episode, not seat.spans
        new = ep.opening(obs.messages) if first else list(obs.messages)
        seat.messages += new
        if first:
            rendered = text = ep.render(seat.messages)
        else:
            rendered, text, agreed = observation_text(
                ep.render, seat.messages, len(new), seat.rendered, seat.as_generated
            )
            self.metrics["env/template_mismatch"] += not agreed
        ids = ep.encode(text)
        room = ep.max_total_tokens - len(seat.tokens.ids) - len(ids)
        if room < 1:
            return None
        seat.tokens.observe(ids)
        seat.rendered = rendered
        budget = replace(self.params, max_new_tokens=min(self.params.max_new_tokens, room))
        request = GenerationRequest(list(seat.tokens.ids), budget, turn_seed(self.seed, turn))
        if self.teacher is not None:
            move = self.teacher(seat.messages, obs.actions, rng)
            res = await ReplayEngine(ep.tokenizer, [move]).agenerate(request)
        else:
            res = await self.engine.agenerate(request)
        if first:
            check_room(self.item, request.prompt_ids, res)
        start = len(seat.tokens.ids)
        seat.tokens.generated(res)
        seat.spans.append((start, len(seat.tokens.ids)))
        seat.keys.append(state_key(obs))
        seat.rewards.append(seat.pending)
        seat.pending = 0.0
        seat.as_generated, seat.last = turn_text(ep.tokenizer, res, budget)
        seat.finish = res.finish_reason
        seat.messages.append({"role": "assistant", "content": seat.last})
        return Action(seat.last, obs.seat, tuple(res.token_ids))


@register_episode("env")
def _env(spec: EpisodeSpec, tokenizer: Any, reward: CompositeReward, sampling: SamplingParams):
    names = list(reward.weights)  # the components, by name
    if not any(n.startswith("env_") for n in names):
        raise ValueError(
            "rollout.episode=env scores what the environment gives: reward.components needs "
            f"env_return (or env_win), got {names}"
        )
    e = spec.env
    return EnvEpisode(
        tokenizer,
        sampling,
        reward,
        max_turns=e.max_turns,
        max_total_tokens=e.max_total_tokens,
        system_prompt=e.system_prompt,
        step_timeout_s=e.step_timeout_s,
    )
