"""On-policy distillation: the student samples, a frozen teacher scores the student's
tokens, and the per-token reverse KL between them is the training signal.

For a sampled token x_t with prefix x_<t, the single-sample reverse KL is
``log p_student(x_t | x_<t) - log p_teacher(x_t | x_<t)``; its expectation under the
student's own samples is KL(student || teacher), which is mode-seeking: the student is
pushed off the tokens the teacher finds unlikely, on the states the student itself
reaches (Agarwal et al., 2024; Thinking Machines' "On-policy distillation", 2025).

``algorithm.distill.mode`` (``algorithm.name: distill``):

- ``advantage`` (the default): token t's advantage is
  ``coef * (log p_teacher - log p_student_behave)``, trained with the run's policy loss
  (``algorithm.policy_loss``, with its clipping and decoupled correction): REINFORCE on
  the negative reverse KL, one advantage per token;
- ``loss``: the advantages are 0 and the reverse KL (the ``algorithm.kl.kind`` estimator
  against the teacher's log-probs) is a penalty of weight ``coef`` in the loss, as the KL
  to a reference model is.

Rewards are not used for training (they are still computed and logged: held-out accuracy
is the measure); no group is dropped for equal rewards.

Teachers: ``algorithm.distill.teacher`` scores every item, except items of a domain named
in ``algorithm.distill.teachers`` (a mixture source tags each item with its source's
name), which that domain's teacher scores. Each teacher is loaded once, frozen, next to
the trainer (colocated), and must share the student's tokenizer (checked at setup).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from streamrl.algorithms.base import Filtered, Timer, register_algorithm
from streamrl.algorithms.losses import RLLoss
from streamrl.algorithms.policy_gradient import PolicyGradient
from streamrl.config.algorithm import AlgorithmConfig, RunContext
from streamrl.config.distill import DistillConfig
from streamrl.core.types import Batch, Trajectory
from streamrl.models.loading import check_model_source, load_model_and_tokenizer
from streamrl.sources import item_domain

DISTILL = "distill"


class Teachers:
    """The frozen teachers of one run and which trajectory each scores; built from the
    ``algorithm.distill`` section alone."""

    def __init__(self, cfg: DistillConfig) -> None:
        self.cfg = cfg
        self.models: dict[str, torch.nn.Module] = {}  # model name -> loaded teacher

    def name_for(self, trajectory: Trajectory) -> str:
        """The teacher (model name) of ``trajectory``'s item."""
        domain = item_domain(trajectory)
        if domain is not None and domain in self.cfg.teachers:
            return self.cfg.teachers[domain]
        if self.cfg.teacher is None:
            raise ValueError(
                f"algorithm.distill: no teacher for domain {domain!r} (teachers: "
                f"{sorted(self.cfg.teachers)}; algorithm.distill.teacher is None)"
            )
        return self.cfg.teacher

    def names(self) -> list[str]:
        named = list(dict.fromkeys(self.cfg.teachers.values()))
        return named if self.cfg.teacher is None else [self.cfg.teacher, *named]

    def check(self) -> None:
        """Fails now, naming the teacher, if one could not be loaded (nothing is loaded):
        the run stops before its SFT and rollouts, not at the first RL step."""
        for name in self.names():
            try:
                check_model_source(name)
            except (OSError, ValueError) as e:
                raise type(e)(f"algorithm.distill: teacher {name!r}: {e}") from None

    def load(self, vocab_size: int, device: torch.device | str) -> None:
        """Loads every teacher once (frozen, eval mode) and checks its vocabulary."""
        for name in self.names():
            if name in self.models:
                continue
            model, _ = load_model_and_tokenizer(name, dtype=self.cfg.dtype)
            size = model.get_output_embeddings().weight.shape[0]
            if size != vocab_size:
                raise ValueError(
                    f"algorithm.distill: teacher {name!r} has a vocabulary of {size} tokens, "
                    f"the student {vocab_size}: a teacher must share the student's tokenizer"
                )
            self.models[name] = model.to(device).eval().requires_grad_(False)

    def logprobs(self, batch: Batch, trajectories: list[Trajectory], trainer: Any) -> torch.Tensor:
        """(N, T) each row's tokens scored by its own teacher."""
        names = [self.name_for(t) for t in trajectories]
        out = torch.zeros_like(batch.behavior_logprobs)
        for name in dict.fromkeys(names):
            rows = torch.tensor([n == name for n in names])
            scored = trainer.compute_logprobs(batch, model=self.models[name])
            out[rows] = scored[rows]
        return out


def reverse_kl(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N, T) the single-sample reverse KL log p_student - log p_teacher of each sampled
    token (0 off ``mask``).

    >>> reverse_kl(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -0.5]]),
    ...            torch.tensor([[True, False]]))
    tensor([[0.5000, 0.0000]])
    """
    return torch.where(mask, student - teacher, torch.zeros_like(student))


@dataclass(frozen=True)
class DistillLoss(RLLoss):
    """The policy-gradient loss, reporting ``distill/reverse_kl``: the mean single-sample
    reverse KL of the batch's tokens (advantage mode: -advantage / coef)."""

    coef: float = 1.0

    def __call__(
        self, outputs: dict[str, torch.Tensor], batch: Batch
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        loss, metrics = super().__call__(outputs, batch)
        mask = batch.loss_mask
        tokens = max(int(mask.sum()), 1)
        metrics["distill/reverse_kl"] = float(-(batch.advantages * mask).sum()) / tokens / self.coef
        return loss, metrics


@register_algorithm(DISTILL)
class Distill(PolicyGradient):
    """The policy-gradient update (its loss, clipping and decoupled correction) with the
    teachers' per-token signal in place of reward advantages."""

    def __init__(self, cfg: AlgorithmConfig, run: RunContext) -> None:
        super().__init__(cfg, run)
        self.distill: DistillConfig = cfg.distill
        self.teachers = Teachers(self.distill)
        self.teachers.check()
        if self.distill.mode == "loss":
            if cfg.kl.coef > 0:
                raise ValueError(
                    "algorithm.distill.mode=loss puts the teacher where the KL reference is: "
                    "set algorithm.kl.coef to 0"
                )
            # the teacher's log-probs stand in the reference's (reported as kl_ref)
            self._loss = replace(self._loss, kl_coef=self.distill.coef)
        else:
            kept = {f.name: getattr(self._loss, f.name) for f in fields(RLLoss)}
            self._loss = DistillLoss(**kept, coef=self.distill.coef)

    def finish_group(
        self, samples: list[Trajectory], extras: dict[str, Trajectory]
    ) -> list[Trajectory] | Filtered:
        return samples  # the signal is the teacher's, not the rewards': no group is dropped

    def setup(self, trainer: Any, tokenizer: Any) -> None:
        super().setup(trainer, tokenizer)
        vocab = trainer.model.get_output_embeddings().weight.shape[0]
        self.teachers.load(vocab, trainer.device)

    def signal(
        self, batch: Batch, trajectories: list[Trajectory], trainer: Any, timer: Timer
    ) -> None:
        with timer("teacher_logprob"):
            teacher = self.teachers.logprobs(batch, trajectories, trainer)
        rkl = reverse_kl(batch.behavior_logprobs, teacher, batch.loss_mask)
        if self.distill.mode == "advantage":
            batch.advantages = -self.distill.coef * rkl
        else:
            batch.advantages = torch.zeros_like(rkl)
            batch.ref_logprobs = teacher
