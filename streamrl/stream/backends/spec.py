"""What a rollout worker needs to build itself in any process: a picklable recipe.

The controller holds the trained model; a worker in another process or on
another machine gets only the architecture (``model_config``), the tokenizer
and what rolling out reads of the config (:class:`~streamrl.rollout.spec.RolloutSpec`),
builds an empty model, and receives its weights from the backend's weight channel
(shared memory, Ray's object store) before it starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from streamrl.algorithms import build_algorithm
from streamrl.engines.factory import make_inference_engine
from streamrl.models.loading import resolve_dtype
from streamrl.rollout.episodes import build_episode, sampling_params
from streamrl.rollout.rewards import build_reward
from streamrl.rollout.selection import build_sampler
from streamrl.rollout.spec import RolloutSpec
from streamrl.rollout.worker import Emit, RolloutWorker


def make_worker(spec: RolloutSpec, engine: Any, tokenizer: Any, emit: Emit) -> RolloutWorker:
    """The rollout worker of a run: the run's episode and algorithm on ``engine``."""
    reward = build_reward(spec.reward)
    reward.bind_policy(engine, tokenizer)  # (a judge that is the policy asks this engine)
    episode = build_episode(spec.episode, tokenizer, reward)
    sampling = sampling_params(spec.rollout, tokenizer)
    return RolloutWorker(
        engine,
        episode,
        build_algorithm(spec.algorithm, spec.context),
        emit,
        group_size=spec.rollout.group_size,
        seed=spec.seed,
        sampler=build_sampler(spec.selection, spec.rollout, spec.seed, tokenizer, sampling),
        reward=reward,
    )


@dataclass
class WorkerSpec:
    rollout_spec: RolloutSpec
    model_config: Any  # transformers.PretrainedConfig
    tokenizer: Any
    device: str = "cpu"

    def build(self, emit: Emit) -> tuple[Any, RolloutWorker]:
        """An engine with randomly initialised weights at version -1 (the backend
        loads the real ones before the worker reports ready) and its worker."""
        if isinstance(self.model_config, dict):  # an environment policy's config
            from streamrl.engines.inference.policy import PolicyEngine
            from streamrl.models.policies import Policy

            engine: Any = PolicyEngine(Policy(self.model_config), device=self.device, version=-1)
            return engine, make_worker(self.rollout_spec, engine, self.tokenizer, emit)
        dtype = resolve_dtype(self.rollout_spec.model.dtype)
        with torch.device(self.device):
            model = AutoModelForCausalLM.from_config(self.model_config, dtype=dtype)
        options = self.rollout_spec.engine_options
        engine = make_inference_engine(
            model, self.tokenizer, device=self.device, version=-1, **options
        )
        return engine, make_worker(self.rollout_spec, engine, self.tokenizer, emit)
