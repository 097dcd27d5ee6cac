"""Plain data types that flow through the streamrl dataflow.

task source --Item--> episode --Trajectory--> sample stream --Batch--> trainer

Everything here is a dataclass of Python scalars and torch tensors: no custom
serialisation, so trajectories pickle, cross process boundaries and go into Ray
object stores unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from streamrl.core.transitions import Transitions, segment_transitions

#: an item's (and its samples') metadata key for an importance weight that scales the
#: sample's advantage: set by whoever issued the item (a group sampler), read by
#: the policy-gradient update and the step metrics
WEIGHT_KEY = "selection_weight"
#: an item's (and its samples') metadata key for a hint (``selection.kind: hints``): a dict
#: with the hint's ``fraction`` of the reference solution, its ``mode`` and, once a rollout
#: worker rendered it, its ``text`` and ``tokens``; ``prefix_ids`` in prefix mode, the
#: tokens the episode forces at the start of the completion (masked from the loss)
HINT_KEY = "hint"


@dataclass
class Item:
    """One task instance yielded by a task source.

    Exactly one of ``prompt`` (plain text) or ``messages`` (chat turns,
    ``[{"role": ..., "content": ...}]``) is set. ``answer`` is the reference the
    reward functions grade against. ``index`` is the issue order assigned by the
    sample stream (-1 until issued).
    """

    id: str
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    answer: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    index: int = -1


@dataclass
class SamplingParams:
    """How one request is decoded.

    ``temperature == 0`` means greedy. ``top_k == 0`` and ``top_p == 1.0`` disable
    those filters. Generation ends at ``max_new_tokens``, at any id in
    ``stop_token_ids`` (kept in the output), or once the decoded continuation
    contains any of ``stop`` (the tokens up to and including the one that
    completed the stop string are kept).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)


@dataclass
class GenerationRequest:
    """A prompt (token ids) plus how to decode it.

    ``seed`` fixes this request's sampling noise independently of how requests
    are batched, so the same request gives the same tokens whatever else is in
    flight (needed for the eta=0 bit-exactness invariant).
    """

    prompt_ids: list[int]
    params: SamplingParams
    seed: int = 0
    # teacher forcing: the engine returns these tokens instead of sampling, each with its
    # log-prob under the request's sampling distribution (scoring a known continuation)
    forced_ids: list[int] | None = None
    # (j, G): member j of G requests sharing ``seed`` (rollout.group_sampling=stratified).
    # Token t's uniform is frac(u + j/G), u a hash of (seed, prompt, tokens so far, t): each
    # member alone samples the exact distribution; members that share a context share u,
    # so their draws there spread evenly over its CDF (systematic sampling), and members
    # whose contexts differ draw independently
    stratum: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.stratum is not None and not 0 <= self.stratum[0] < self.stratum[1]:
            raise ValueError(f"stratum {self.stratum}: need 0 <= j < G")


@dataclass
class GenerationResult:
    """What the inference engine returns for one request.

    ``logprobs[i]`` is log p(token_ids[i]) under the exact distribution the token
    was sampled from (after temperature / top-k / top-p); for greedy decoding
    (temperature 0) it is the log-softmax of the raw logits. ``versions[i]`` is the weight version that produced token i.
    ``finish_reason`` is one of "stop" (stop string or stop token) or "length".
    """

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str


@dataclass
class Trajectory:
    """One scored episode, as flat per-token tensors of length T.

    input_ids:         (T,) long   prompt + generated (+ tool output) tokens
    loss_mask:         (T,) bool   True only for tokens the policy generated
    behavior_logprobs: (T,) float  log-prob under the behaviour policy (0 where masked)
    versions:          (T,) long   weight version that produced each token (-1 where masked)
    reward:            scalar episode reward (weighted sum of components)
    item_index:        the issue index of the item it answers; the samples of one
                       item (one prompt) form a group
    metadata:          reward components, decoded text, finish reason, ...

    A :class:`~streamrl.core.sample.Sample`: a language model's tokens, scored as a whole.
    """

    environment: ClassVar[bool] = False

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    behavior_logprobs: torch.Tensor
    versions: torch.Tensor
    reward: float
    item_index: int = -1
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.input_ids.shape[0]
        for name in ("loss_mask", "behavior_logprobs", "versions"):
            t = getattr(self, name)
            if t.shape != (n,):
                raise ValueError(f"Trajectory.{name} has shape {tuple(t.shape)}, expected ({n},)")

    @property
    def min_version(self) -> int:
        """Oldest weight version among generated tokens (used for staleness)."""
        gen = self.versions[self.loss_mask]
        return int(gen.min()) if gen.numel() else -1

    @property
    def num_generated(self) -> int:
        return int(self.loss_mask.sum())

    @property
    def logged(self) -> bool:
        return False

    @property
    def episode_returns(self) -> list[float]:
        return []

    @property
    def episode_lengths(self) -> list[int]:
        return []

    def step_rewards(self) -> tuple[int, float]:
        return 1, self.reward

    def transitions(self) -> Transitions:
        raise TypeError("a language model's trajectory has no environment transitions")


@dataclass
class Batch:
    """A padded training batch built from N trajectories (right-padded to T).

    input_ids:         (N, T) long
    attention_mask:    (N, T) bool   True for real tokens
    loss_mask:         (N, T) bool   True for generated tokens (targets of the loss)
    behavior_logprobs: (N, T) float
    versions:          (N, T) long
    rewards:           (N,)   float
    item_index:        (N,)   long   the group (item) of each row
    advantages:        (N, T) float  filled by the algorithm before train_batch
    ref_logprobs:      (N, T) float | None  frozen reference model, when KL is on
    proximal_logprobs: (N, T) float | None  current weights before the update
                                            (decoupled objective), when enabled
    values, returns:   (N, T) float | None  a learned critic's values before the update
                                            and its targets (PPO with GAE)
    demonstration:     (N,)   bool | None   rows that are demonstrations, trained by
                                            likelihood (interleaved SFT), not by RL

    Position t of every per-token tensor describes token ``input_ids[:, t]``; the
    train engine shifts logits so that logprobs[:, t] = log p(input_ids[:, t] | < t).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    behavior_logprobs: torch.Tensor
    versions: torch.Tensor
    rewards: torch.Tensor
    item_index: torch.Tensor
    advantages: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    proximal_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    demonstration: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @classmethod
    def collate(cls, trajectories: list[Trajectory], pad_id: int = 0) -> Batch:
        n = len(trajectories)
        if n == 0:
            raise ValueError("cannot collate an empty list of trajectories")
        t_max = max(int(t.input_ids.shape[0]) for t in trajectories)
        input_ids = torch.full((n, t_max), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((n, t_max), dtype=torch.bool)
        loss_mask = torch.zeros((n, t_max), dtype=torch.bool)
        behavior = torch.zeros((n, t_max), dtype=torch.float32)
        versions = torch.full((n, t_max), -1, dtype=torch.long)
        for i, tr in enumerate(trajectories):
            length = int(tr.input_ids.shape[0])
            input_ids[i, :length] = tr.input_ids
            attention_mask[i, :length] = True
            loss_mask[i, :length] = tr.loss_mask
            behavior[i, :length] = tr.behavior_logprobs
            versions[i, :length] = tr.versions
        return cls(
            input_ids=input_ids,
            attention_mask=attention_mask,
            loss_mask=loss_mask,
            behavior_logprobs=behavior,
            versions=versions,
            rewards=torch.tensor([tr.reward for tr in trajectories], dtype=torch.float32),
            item_index=torch.tensor([tr.item_index for tr in trajectories], dtype=torch.long),
        )


@dataclass
class Segment:
    """T steps of N vectorised environments, as the behaviour policy played them.

    obs:             (T, N, *obs_shape) float32  observation before each step
    actions:         (T, N, *act_shape)          long (discrete) or float32 (continuous)
    logprobs:        (T, N) float32  log pi_behave(action | obs)
    values:          (T, N) float32  V_behave(obs)
    rewards:         (T, N) float32
    terminated:      (T, N) bool     the episode ended in a terminal state (no bootstrap)
    truncated:       (T, N) bool     the episode was cut (time limit): bootstrap from
    final_values:    (T, N) float32  V(final observation) where an episode ended, else 0
    last_obs:        (N, *obs_shape) the observation after the last step
    last_values:     (N,) float32    V(last_obs): the bootstrap of the segment's tail
    versions:        (T,) long       the weight version that chose each step's actions
    episode_returns / episode_lengths: episodes that finished during the segment

    Environments reset in the step an episode ends (gymnasium's same-step autoreset), so
    step t's transition is always (obs[t], actions[t], rewards[t], next state), with the
    final observation of an ended episode only in ``final_values``.

    A :class:`~streamrl.core.sample.Sample` of environment steps this run's policy played.
    """

    environment: ClassVar[bool] = True

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    final_values: torch.Tensor
    last_obs: torch.Tensor
    last_values: torch.Tensor
    versions: torch.Tensor
    item_index: int = -1
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def reward(self) -> float:
        """Mean reward per step (the stream's and the pool's notion of a sample's reward)."""
        return float(self.rewards.mean())

    @property
    def min_version(self) -> int:
        return int(self.versions.min())

    @property
    def num_generated(self) -> int:
        return int(self.rewards.numel())

    @property
    def logged(self) -> bool:
        return False

    def step_rewards(self) -> tuple[int, float]:
        return int(self.rewards.numel()), float(self.rewards.sum())

    def transitions(self) -> Transitions:
        return segment_transitions(self)
