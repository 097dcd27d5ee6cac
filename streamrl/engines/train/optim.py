"""The optimizer side every train engine shares: AdamW, learning-rate schedules,
gradient clipping, and checkpoint state (:class:`TrainEngine` for language models,
:class:`~streamrl.engines.train.policy.PolicyTrainEngine` for environment policies)."""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from streamrl.engines import malloc
from streamrl.engines.train.dcp import DCP_FORMAT, load_sharded
from streamrl.engines.train.schedule import lr_factor


class Optimized:
    """A model and an AdamW over its trainable parameters (plus registered extras)."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.95),
        max_grad_norm: float | None = 1.0,
        device: str | torch.device = "cpu",
        eps: float = 1e-8,
        fused: bool = True,
        keep_freed_memory: bool = True,
    ) -> None:
        self.device = torch.device(device)
        if keep_freed_memory and self.device.type == "cpu":
            # an update frees and re-allocates its activations: keep them in the process
            # instead of faulting them in again (an isolated SmolLM2 update: 0.80x as long;
            # malloc.py)
            malloc.keep_freed_memory()
        # fused: one pass over each parameter instead of a dozen foreach ops. It pays for
        # tiny policies (per-op overhead) and for large models (memory traffic): with
        # SmolLM2-135M on one CPU thread, the 48-token GRPO update took 9.96 s against
        # 10.37 s with foreach (benchmarks/bench_train_step.py --variants default
        # foreach-adam; AdamW's step alone: ~0.09 s against 0.30-0.52 s)
        self._adam = {"betas": betas, "weight_decay": weight_decay, "eps": eps, "fused": fused}
        self.model = model.to(self.device)
        self.max_grad_norm = max_grad_norm
        self.extras: list[torch.nn.Module] = []  # trained with the model (a value head)
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        if not self.trainable:
            raise ValueError("model has no trainable parameters")
        self.optimizer = torch.optim.AdamW(self.trainable, lr=lr, **self._adam)
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.global_step = 0  # optimizer steps taken

    def add_trainable(self, module: torch.nn.Module) -> None:
        """Train ``module`` with the model (from the next ``reset_optimizer``)."""
        self.extras.append(module.to(self.device))
        self.trainable += [p for p in module.parameters() if p.requires_grad]

    def reset_optimizer(
        self,
        lr: float,
        *,
        schedule: str = "constant",
        warmup_steps: int = 0,
        total_steps: int = 0,
        min_lr_ratio: float = 0.0,
    ) -> None:
        """A fresh AdamW (same hyper-parameters, peak ``lr``) and learning-rate schedule,
        e.g. at the start of SFT and of RL. ``total_steps``: optimizer steps of the stage."""
        self.optimizer = torch.optim.AdamW(self.trainable, lr=lr, **self._adam)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            functools.partial(
                lr_factor,
                schedule=schedule,
                warmup=warmup_steps,
                total=total_steps,
                min_ratio=min_lr_ratio,
            ),
        )

    def step_optimizer(self) -> float | None:
        """Clip the gradient and step; returns its norm, or None (no step) if non-finite."""
        grad_norm = self.clip_gradients(self.max_grad_norm if self.max_grad_norm else math.inf)
        if not torch.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.global_step += 1
        return float(grad_norm)

    def clip_gradients(self, max_norm: float) -> torch.Tensor:
        """Scale the gradients to a total norm of at most ``max_norm``; their norm before."""
        return torch.nn.utils.clip_grad_norm_(self.trainable, max_norm)

    def checkpoint_state(self) -> dict[str, Any]:
        """Weights (adapters included), optimizer and schedule: everything to continue."""
        return {
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "extras": [m.state_dict() for m in self.extras],
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "global_step": self.global_step,
        }

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`checkpoint_state` (after ``reset_optimizer`` built the stage's
        optimizer and schedule). A sharded engine's checkpoint (DCP, any number of
        ranks) is read into this unsharded engine's full tensors."""
        if state.get("format") == DCP_FORMAT:
            load_sharded(self, state["dcp_dir"])
        else:
            self.model.load_state_dict(state["model"])
            for module, extra in zip(self.extras, state.get("extras", []), strict=True):
                module.load_state_dict(extra)
            self.optimizer.load_state_dict(state["optimizer"])
        if state["scheduler"] is not None and self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.global_step = state["global_step"]
