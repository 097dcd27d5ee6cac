"""Held-out evaluation of the model being trained, and how its results are named in
``summary.json``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from streamrl.analysis.evaluate import EvalResult, evaluate_model
from streamrl.config import Config
from streamrl.core.types import Item


def summary_key(metric: str, when: str) -> str:
    """``eval/accuracy`` -> ``eval_accuracy_<when>``; ``eval/accuracy/math`` ->
    ``eval_accuracy_<when>/math``; ``eval/return`` -> ``eval_return_<when>``."""
    _, name, *domain = metric.split("/")
    return "/".join([f"eval_{name}_{when}", *domain])


def after_summary(row: dict[str, float], when: str) -> dict[str, float]:
    """An evaluation's metrics, named for the summary (:func:`summary_key`)."""
    return {summary_key(k, when): v for k, v in row.items()}


class Evaluator:
    """``evaluate(tag)``: the held-out metrics of ``model`` now, logged under ``tag``."""

    def __init__(
        self,
        cfg: Config,
        model: torch.nn.Module,
        tokenizer: Any,
        episode: Any,
        heldout: list[Item],
        device: str,
        log: logging.Logger,
    ) -> None:
        self.cfg, self.model, self.tokenizer, self.episode = cfg, model, tokenizer, episode
        self.heldout, self.device, self.log = heldout, device, log
        # where the model's current weights come from when the trainer's are elsewhere
        # (a sharded trainer): loaded into ``model`` before each evaluation
        self.weights: Callable[[], dict[str, torch.Tensor]] | None = None

    def __call__(self, tag: str, *, sampled: bool = True) -> dict[str, float]:
        """``eval/accuracy`` on the held-out items, and ``eval/accuracy/<domain>``; for an
        environment, ``eval/return``: the mean return of deterministic episodes. For a
        language task with ``eval.samples`` = n > 0 also ``eval/sampled_accuracy``: the
        mean correctness of n samples per item at the rollout temperature."""
        res = self.evaluate_heldout(greedy=True)
        if "return_mean" in res.metrics:
            self.log.info("eval %s: mean return %.2f", tag, res.metrics["return_mean"])
            return {"eval/return": res.metrics["return_mean"]}
        self.log.info("eval %s: accuracy %.4f on %d items", tag, res.accuracy, len(res.items))
        domains = {k: v for k, v in res.metrics.items() if k.startswith("accuracy/")}
        row = {"eval/accuracy": res.accuracy, **{f"eval/{k}": v for k, v in domains.items()}}
        if sampled and self.cfg.eval.samples:
            many = self.evaluate_heldout(greedy=False)  # avg@1 over n > 1 samples
            row["eval/sampled_accuracy"] = many.metrics.get("avg@1", many.accuracy)
            self.log.info(
                "eval %s: sampled accuracy %.4f (%d samples per item)",
                tag,
                row["eval/sampled_accuracy"],
                self.cfg.eval.samples,
            )
        return row

    def evaluate_heldout(self, *, greedy: bool) -> EvalResult:
        """The held-out items through the evaluation episode: one greedy sample each, or
        ``eval.samples`` samples at the rollout temperature."""
        if self.weights is not None:
            self.model.load_state_dict(self.weights(), strict=False)
        return evaluate_model(
            self.model,
            self.tokenizer,
            self.episode,
            self.heldout,
            self.cfg.reward.correct_reward,
            device=self.device,
            greedy=greedy,
            samples_per_item=self.cfg.eval.samples,
            seed=self.cfg.seed,
        )
