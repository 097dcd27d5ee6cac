"""The episode interface, the episode registry, and the sampling parameters of a run.

An episode is an async callable ``(engine, item, seed, *, greedy=False) ->
Trajectory | None``. It calls the engine as often as it needs (once for a
single-turn answer, once per turn for an agent), scores the result and returns
one trajectory; ``None`` rejects the episode (counted, never silent). Training
and evaluation run the same episode object: evaluation passes ``greedy=True``.

Register a new kind with ``@register_episode("name")`` on a factory
``(spec, tokenizer, reward, sampling) -> Episode``; ``rollout.episode`` selects it.
``spec`` is the :class:`EpisodeSpec`: the config sections an episode may read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from streamrl.core.engine import InferenceEngine
from streamrl.core.types import GenerationResult, Item, SamplingParams, Trajectory

if TYPE_CHECKING:
    from streamrl.config import AgentConfig, EnvConfig, RolloutConfig
    from streamrl.rollout.rewards import CompositeReward


class Episode(Protocol):
    """One rollout of an item. A language-model episode may also declare the optional
    capabilities below (:class:`MeasuresPrompts`, :class:`SamplesWith`)."""

    async def __call__(
        self,
        engine: InferenceEngine,
        item: Item,
        seed: int,
        *,
        greedy: bool = False,
    ) -> Trajectory | None:
        """One episode of ``item``, its sampling fixed by ``seed``."""
        ...


@dataclass
class Trajectories:
    """What an episode with several seats returns instead of one trajectory (a game the
    policy plays against itself): one trajectory per seat the policy played, each with its
    own token versions, and the episode's ``metrics``, counted once for the episode rather
    than per seat. The item stays one group: the worker reports all of them in it.

    An episode that ended without a usable trajectory (its environment failed) returns
    none, with ``error``, the counted reason (``env_error:<kind>``); its metrics still
    count, and the group goes on with the episodes that did not fail."""

    trajectories: list[Any]
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    def __repr__(self) -> str:  # (asyncio formats finished tasks' results: keep it short)
        return f"Trajectories({len(self.trajectories)} trajectories, error={self.error!r})"


def episode_output(result: Any) -> Trajectories:
    """An episode's result as :class:`Trajectories` (one sample: a list of one)."""
    return result if isinstance(result, Trajectories) else Trajectories([result])


@runtime_checkable
class MeasuresPrompts(Protocol):
    """``prompt_ids(item)``: the tokens of the episode's first request; preflight measures
    prompts with it (else with :func:`~streamrl.models.encode_prompt`) against the
    model's context."""

    def prompt_ids(self, item: Item) -> list[int]: ...


@runtime_checkable
class SamplesWith(Protocol):
    """The sampling parameters the episode generates with (``streamrl eval`` records them)."""

    sampling: SamplingParams


class PromptTooLong(ValueError):
    """The item's prompt leaves no room in the model's context for one generated token:
    the rollout counts its group as filtered (``prompt_too_long``), evaluation as an
    incorrect answer with this error; preflight counts such prompts before the run."""

    reason = "prompt_too_long"


def check_room(item: Item, prompt_ids: list[int], result: GenerationResult) -> None:
    """Raise PromptTooLong when the engine ended ``item``'s first request without a
    token for want of room (an engine answers a prompt that fills its context with no
    tokens and ``finish_reason="length"``; a request that asks for no tokens is never sent)."""
    if not result.token_ids and result.finish_reason == "length":
        raise PromptTooLong(
            f"item {item.id!r}: its prompt of {len(prompt_ids)} tokens leaves no room for a "
            "generated token in the model's context"
        )


@dataclass(frozen=True, kw_only=True)
class EpisodeSpec:
    """What an episode factory reads of the run's config: the ``rollout``, ``agent`` and
    ``env`` sections and the run's seed (``streamrl.run.assembly.episode_spec`` fills it)."""

    rollout: RolloutConfig
    agent: AgentConfig
    env: EnvConfig
    seed: int


EpisodeFactory = Callable[[EpisodeSpec, Any, "CompositeReward", SamplingParams], Episode]
_EPISODES: dict[str, EpisodeFactory] = {}


def register_episode(kind: str) -> Callable[[EpisodeFactory], EpisodeFactory]:
    def decorator(factory: EpisodeFactory) -> EpisodeFactory:
        if kind in _EPISODES and _EPISODES[kind] is not factory:
            raise ValueError(f"episode kind {kind!r} is already registered")
        _EPISODES[kind] = factory
        return factory

    return decorator


def episode_kinds() -> list[str]:
    return sorted(_EPISODES)


def sampling_params(
    rollout: RolloutConfig, tokenizer: Any, max_new_tokens: int | None = None
) -> SamplingParams:
    """How the run samples: ``rollout.*``, stopping at EOS unless ``rollout.ignore_eos``."""
    eos_id = getattr(tokenizer, "eos_token_id", None)  # None: no tokenizer (a policy)
    eos = [eos_id] if eos_id is not None else []
    return SamplingParams(
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        max_new_tokens=max_new_tokens or rollout.max_new_tokens,
        stop=list(rollout.stop),
        stop_token_ids=[] if rollout.ignore_eos else eos,
    )


def build_episode(
    spec: EpisodeSpec,
    tokenizer: Any,
    reward: CompositeReward,
    *,
    max_new_tokens: int | None = None,
) -> Episode:
    """The run's episode (``rollout.episode``); ``max_new_tokens`` overrides the budget
    (evaluation's ``eval.max_new_tokens``). Per-item budgets still take precedence."""
    kind = spec.rollout.episode
    if kind not in _EPISODES:
        raise ValueError(
            f"rollout.episode: unknown kind {kind!r}; known: {', '.join(episode_kinds())}"
        )
    sampling = sampling_params(spec.rollout, tokenizer, max_new_tokens)
    return _EPISODES[kind](spec, tokenizer, reward, sampling)
