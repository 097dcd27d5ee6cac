"""Console progress: a live bar on a terminal, plain lines every 10% otherwise."""

from __future__ import annotations

import sys


class Progress:
    """Live progress bar: stage, step, reward, accuracy, tokens/s, staleness."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self._bar = None
        self._tasks: dict[str, int] = {}
        self._last_return = float("nan")  # an environment run's latest episode return

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[info]}"),
            )
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, stage: str, step: int, total: int, m: dict) -> None:
        staleness = (
            f"staleness {m.get('staleness/mean', 0):.2f} (max {m.get('staleness/max', 0):.0f})"
        )
        if stage != "rl":  # a stage before RL (SFT, DPO, A-LoL)
            info = f"loss {m.get('loss', float('nan')):.3f}"
            if "reward_accuracy" in m:  # DPO: pairs whose chosen completion wins
                info += f"  pair acc {m['reward_accuracy']:.3f}"
            if "eval/accuracy" in m:  # the stage's periodic evaluation (sft.eval_every)
                info += f"  eval {m['eval/accuracy']:.3f}"
        elif "env_steps" in m:  # an environment run: episode returns, not answers
            self._last_return = m.get("episode_return", self._last_return)
            info = (
                f"return {self._last_return:.1f}  "
                f"env steps/s {m.get('env_steps_per_s', 0):.0f}  {staleness}"
            )
            if "offline/fraction" in m:  # logged data in the batch (offline RL)
                info += f"  offline {m['offline/fraction']:.2f}  loss {m.get('loss', 0):.3f}"
            if "eval/return" in m:
                info += f"  eval return {m['eval/return']:.1f}"
        else:
            info = (
                f"reward {m.get('rollout/reward_mean', m.get('reward_mean', 0)):.3f}  "
                f"batch acc {m.get('accuracy', 0):.3f}  "
                f"tok/s {m.get('tokens_per_s', 0):.0f}  {staleness}"
            )
            if "eval/accuracy" in m:
                info += f"  eval {m['eval/accuracy']:.3f}"
        if self._bar is None:
            if step == total or step % max(1, total // 10) == 0 or "eval/accuracy" in m:
                print(f"[{stage}] step {step}/{total}  {info}", file=sys.stderr, flush=True)
            return
        if stage not in self._tasks:
            self._tasks[stage] = self._bar.add_task(stage.upper(), total=total, info="")
        self._bar.update(self._tasks[stage], completed=step, info=info)
