"""What a rollout worker needs to build itself in any process: a picklable recipe.

The controller holds the trained model; a worker in another process or on
another machine gets only the architecture (``model_config``), the tokenizer
and the run config, builds an empty model, and receives its weights from the
backend's weight channel (shared memory, Ray's object store) before it starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from streamrl.algorithms import build_algorithm
from streamrl.config import Config, RunContext
from streamrl.engines.factory import engine_options, make_inference_engine
from streamrl.models.loading import resolve_dtype
from streamrl.rollout.episodes import build_episode, sampling_params
from streamrl.rollout.rewards import build_reward
from streamrl.rollout.selection import build_sampler
from streamrl.rollout.worker import Emit, RolloutWorker


def make_worker(cfg: Config, engine: Any, tokenizer: Any, emit: Emit) -> RolloutWorker:
    """The rollout worker of a run: the run's episode and algorithm on ``engine``."""
    reward = build_reward(cfg.reward)
    episode = build_episode(cfg, tokenizer, reward)
    sampling = sampling_params(cfg, tokenizer)
    return RolloutWorker(
        engine,
        episode,
        build_algorithm(cfg.algorithm, RunContext.of(cfg)),
        emit,
        group_size=cfg.rollout.group_size,
        seed=cfg.seed,
        sampler=build_sampler(cfg.selection, cfg.rollout, cfg.seed, tokenizer, sampling),
        reward=reward,
    )


@dataclass
class WorkerSpec:
    cfg: Config
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
            return engine, make_worker(self.cfg, engine, self.tokenizer, emit)
        dtype = resolve_dtype(self.cfg.model.dtype)
        with torch.device(self.device):
            model = AutoModelForCausalLM.from_config(self.model_config, dtype=dtype)
        engine = make_inference_engine(
            model, self.tokenizer, device=self.device, version=-1, **engine_options(self.cfg)
        )
        return engine, make_worker(self.cfg, engine, self.tokenizer, emit)
