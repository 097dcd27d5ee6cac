"""The stages before RL: SFT on the task's demonstrations, DPO, A-LoL, in this order,
each when its ``steps`` > 0, each continued from a checkpoint written inside it."""

from __future__ import annotations

from typing import Any

from streamrl.algorithms.stages import (
    PRE_RL_STAGES,
    STAGES,
    StageData,
    StageInputs,
    context_length,
    run_stage,
)
from streamrl.core.timing import StageTimer
from streamrl.engines.train.engine import TrainEngine
from streamrl.rollout.episodes import build_episode
from streamrl.run.assembly import episode_spec
from streamrl.run.checkpoint import Checkpoint, set_rng_state
from streamrl.run.checkpointing import CheckpointState
from streamrl.run.evaluation import Evaluator, summary_key
from streamrl.run.hooks.progress import Progress
from streamrl.run.preflight import Inputs


def start_stage(trainer: TrainEngine, section: Any, optimizer_steps: int) -> None:
    """Fresh AdamW and learning-rate schedule for a stage (``cfg.sft`` or ``cfg.train``)."""
    trainer.reset_optimizer(
        section.lr,
        schedule=section.lr_schedule,
        warmup_steps=section.warmup_steps,
        total_steps=optimizer_steps,
        min_lr_ratio=section.min_lr_ratio,
    )


class PreRLStages(CheckpointState):
    """The session's pre-RL stages (a part of :class:`~streamrl.run.session.Session`)."""

    inputs: Inputs
    progress: Progress | None
    model: Any
    tokenizer: Any
    evaluate: Evaluator

    def pre_rl_stages(self, ckpt: Checkpoint | None) -> str | None:
        """SFT, DPO, A-LoL in this order, each when its ``steps`` > 0. A checkpoint written
        inside one continues it and skips those before it. The held-out accuracy after each
        stage but the last (whose is the evaluation before RL) goes into the summary as
        ``eval_<metric>_after_<stage>``. Returns the last stage run, if any."""
        names = [s for s in PRE_RL_STAGES if getattr(self.cfg, s).steps > 0]
        if ckpt is not None:
            names = names[names.index(ckpt.stage) :]
        for k, name in enumerate(names):
            self.train_stage(name, ckpt if ckpt is not None and ckpt.stage == name else None)
            if k < len(names) - 1:
                after = self.evaluate(f"after {name}")
                self.summary.update({summary_key(m, f"after_{name}"): v for m, v in after.items()})
        return names[-1] if names else None

    def stage_data(self, name: str) -> StageData:
        """The batches, loss and extra models of pre-RL stage ``name``."""
        cfg = self.cfg
        inputs = StageInputs(
            self.tokenizer,
            self.trainer,
            cfg.seed,
            max_len=context_length(self.model),
            items=self.inputs.source.train_iter,
            episode=lambda: build_episode(episode_spec(cfg), self.tokenizer, self.inputs.reward),
        )
        return STAGES[name](getattr(cfg, name), inputs)

    def train_stage(self, name: str, ckpt: Checkpoint | None) -> None:
        """``cfg.<name>.steps`` optimizer steps of a pre-RL stage (SFT on the task's
        demonstrations, DPO, A-LoL), continued from a checkpoint of it: the batch stream
        skips the batches already trained on, and the stage's reference is restored."""
        cfg, trainer = self.cfg, self.trainer
        section = getattr(cfg, name)
        start_stage(trainer, section, section.steps)
        stage = self.stage_data(name)  # a reference is taken from the policy here
        for key, value in (stage.summary or {}).items():
            self.summary[f"{name}/{key}"] = value
        start = 0
        if ckpt is not None:
            trainer.load_checkpoint_state(ckpt.trainer)
            stage.load_state_dict(ckpt.state.get("stage_models", {}))
            if ckpt.state.get("stage_done"):  # it ended at its evaluation threshold
                set_rng_state(ckpt.state["rng"])
                return
            start = ckpt.step
            for _ in range(start):
                next(stage.batches)
            set_rng_state(ckpt.state["rng"])
        eval_every, stop_at = section.eval_every, section.stop_at_eval
        reached: list[int] = []

        def on_step(step: int, m: dict) -> bool:
            every, done = cfg.run.checkpoint_every, step + 1
            if eval_every and done % eval_every == 0:
                m = {**m, **self.evaluate(f"{name} step {done}", sampled=False)}
                if stop_at is not None and m["eval/accuracy"] >= stop_at:
                    reached.append(done)
            self.run.metrics.log_aux(name, step, m)
            if self.progress:
                self.progress(name, step + 1, section.steps, m)
            if reached:
                return True
            if every and done % every == 0 and done < section.steps and not self.stop.requested:
                self.checkpoint(name, done, stage_models=stage.state_dict())
            return self.stop.requested

        timer = StageTimer()
        with timer(name):
            done, last = run_stage(
                trainer, stage.batches, section.steps, stage.loss_fn, on_step, start, stage.prepare
            )
        seconds = timer.seconds[f"time/{name}"]
        self.summary[f"{name}_time_s"] = self.summary.get(f"{name}_time_s", 0.0) + seconds
        self.summary[f"{name}_final_loss"] = last.get("loss")
        self.summary[f"{name}_steps_done"] = done
        self.checkpoint(name, done, stage_models=stage.state_dict(), stage_done=bool(reached))
        if reached:
            self.run.log.info(
                "%s: held-out accuracy reached %s at step %d; on to the next stage",
                name,
                stop_at,
                done,
            )
        elif done < section.steps:
            raise self.interrupted(name.upper(), done)
