"""The ``train`` config section: RL steps, batch sizes and the optimizer."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from streamrl.config.base import LRSchedule, Section


class TrainConfig(Section):
    steps: int = Field(200, ge=0, description="RL steps (one batch each).")
    items_per_step: int = Field(
        16,
        ge=1,
        description="Items (prompts) per RL step; each is rolled out "
        "rollout.group_size times, so a step trains on items_per_step * group_size sequences.",
    )
    num_minibatches: int = Field(1, ge=1, description="Optimizer steps per pass over a batch.")
    epochs: int = Field(
        1, ge=1, description="Passes over each batch (PPO epochs; environment policies)."
    )
    micro_batch_sequences: int = Field(
        64, ge=1, description="Sequences per forward/backward (gradient accumulation unit)."
    )
    compile: bool = Field(
        False,
        description="torch.compile the language model's decoder layers for training "
        "(dynamic shapes, one graph for every layer). SmolLM2 on one CPU thread: updates "
        "0.90-1.03x as long (0.95x per token in RL), after ~40 s of compiling in the first "
        "one, so it pays on long runs only (benchmarks/results/rl_step.md).",
    )
    world_size: int = Field(
        1,
        ge=1,
        description="Trainer ranks: above 1, the policy and every model the algorithm owns "
        "are sharded over this many processes with FSDP2 (gloo on CPU, NCCL on CUDA), and "
        "an update is the one a single rank would apply (docs/distributed.md).",
    )
    reshard_after_forward: bool = Field(
        True,
        description="train.world_size > 1: release each decoder layer's gathered parameters "
        "after its forward (FSDP2's ZeRO-3 default). false keeps them gathered from a "
        "minibatch's first forward to its last backward and accumulates its gradients "
        "unsharded: one all-gather and one reduce-scatter a minibatch instead of two "
        "all-gathers and a reduce-scatter a micro-batch (SmolLM2, 2 gloo ranks, 64 sequences: "
        "1.57x the update rate), for the full parameters and gradients held during the "
        "minibatch; the training state after a step is 1/N either way (docs/distributed.md).",
    )
    lr: float = Field(1e-4, gt=0, description="AdamW peak learning rate for RL.")
    lr_schedule: LRSchedule = Field(
        "constant",
        description="RL learning-rate schedule after warm-up: constant, linear "
        "or cosine decay to min_lr_ratio * lr at the last optimizer step.",
    )
    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear warm-up from 0.")
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="Final learning rate of linear/cosine decay, as a fraction."
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    placement: Literal["local", "ray"] = Field(
        "local",
        description="Where ranks 1..N-1 run (train.world_size > 1): 'local' spawns them as "
        "processes on this machine (rank 0 is the run's own trainer); 'ray' runs every rank "
        "as a Ray actor in one placement group (the controller in rank 0's actor).",
    )
    ray_strategy: Literal["STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD"] = Field(
        "STRICT_PACK",
        description="train.placement=ray: the placement group's strategy for the ranks "
        "(STRICT_PACK: one node; SPREAD: across nodes where it can).",
    )
    collective_timeout_s: float = Field(
        300.0,
        gt=0,
        description="train.world_size > 1: a rendezvous or collective that waits longer fails, "
        "and the rank group restarts from the latest checkpoint (a hung rank is never a "
        "silent hang); up to runtime.max_trainer_restarts times.",
    )
