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

from streamrl.config import Config, RewardConfig
from streamrl.engines.inference import LocalEngine
from streamrl.episodes.single_turn import SingleTurnEpisode
from streamrl.models.loading import resolve_dtype
from streamrl.rewards import CompositeReward
from streamrl.rollout import Emit, RolloutWorker
from streamrl.types import SamplingParams


def sampling_params(cfg: Config, tokenizer: Any) -> SamplingParams:
    r = cfg.rollout
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    if r.ignore_eos:
        eos = []
    return SamplingParams(
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_new_tokens=r.max_new_tokens,
        stop=list(r.stop),
        stop_token_ids=eos,
    )


def build_reward(cfg: RewardConfig) -> CompositeReward:
    components = [(c.name, c.weight, c.options) for c in cfg.components]
    return CompositeReward(components, timeout_s=cfg.timeout_s)


def make_worker(cfg: Config, engine: LocalEngine, tokenizer: Any, emit: Emit) -> RolloutWorker:
    """The rollout worker of a run: single-turn episodes scored by the run's reward."""
    episode = SingleTurnEpisode(
        tokenizer, sampling_params(cfg, tokenizer), build_reward(cfg.reward)
    )
    return RolloutWorker(
        engine,
        episode,
        emit,
        group_size=cfg.rollout.group_size,
        seed=cfg.seed,
        dynamic_sampling=cfg.algorithm.dynamic_sampling,
        greedy_baseline=cfg.algorithm.advantage == "remax",
    )


@dataclass
class WorkerSpec:
    cfg: Config
    model_config: Any  # transformers.PretrainedConfig
    tokenizer: Any
    device: str = "cpu"

    def build(self, emit: Emit) -> tuple[LocalEngine, RolloutWorker]:
        """An engine with randomly initialised weights at version -1 (the backend
        loads the real ones before the worker reports ready) and its worker."""
        dtype = resolve_dtype(self.cfg.model.dtype)
        with torch.device(self.device):
            model = AutoModelForCausalLM.from_config(self.model_config, dtype=dtype)
        engine = LocalEngine(
            model,
            self.tokenizer,
            max_batch_size=self.cfg.rollout.max_batch_size,
            device=self.device,
            version=-1,
        )
        return engine, make_worker(self.cfg, engine, self.tokenizer, emit)
