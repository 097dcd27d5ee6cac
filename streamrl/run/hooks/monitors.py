"""Reward-hacking monitors: cheap checks of every step's metrics row, on by default.

Each monitor turns the row (and the rows before it) into one statistic, written to the
row as ``monitor/<name>``; past its threshold (``monitors.<name>.threshold``) it fires:
``monitor_fired/<name>`` is 1, one warning line goes to the console and ``run.log``, and
with ``action: stop`` the run ends after the step (``summary.json``: ``status:
stopped_by_monitor``, ``stopped_by_monitor: <name>``). A monitor with nothing to read
(no evaluation yet, no judge component, no KL metric) stays quiet and writes nothing.

=====================  ==================================================================
``length_drift``       recent mean response length / the first ``window`` steps' - 1
``length_jump``        one step's mean response length / the step before's - 1
``component_dominance``  one component's share of sum |weight x mean| (not the judge of
                       correctness; two or more weighted components)
``entropy_collapse``   1 - recent entropy / the baseline's (``entropy``, else the sampled
                       tokens' mean negative log-prob)
``kl_acceleration``    KL growth over the last ``window`` steps - over the ``window`` before
``reward_divergence``  between evaluations: min(training reward's rise, held-out fall)
``judge_saturation``   a judge component's mean score
``judge_disagreement`` fraction of answers a judge and the correct reward disagree on
=====================  ==================================================================
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from streamrl.config.monitors import MonitorsConfig, Rule
from streamrl.run.hooks.base import Decision, StepHook, last_step
from streamrl.run.step_metrics import component_key
from streamrl.stream.pools import Pool

STOPPED = "stopped_by_monitor"
JUDGES = ("llm_judge", "reward_model", "pairwise_judge", "tournament_judge", "rubric_judge")


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


class History:
    """The rows seen so far, and the few things the statistics ask of them."""

    def __init__(self, window: int) -> None:
        self.window, self.rows = window, []

    def series(self, key: str) -> list[float]:
        return [r[key] for r in self.rows if key in r]

    def baseline_and_recent(self, key: str) -> tuple[float, float] | None:
        """(mean of the first ``window`` values, of the last ``window``), once the two
        windows do not overlap."""
        s, w = self.series(key), self.window
        return (_mean(s[:w]), _mean(s[-w:])) if len(s) >= 2 * w else None


Statistic = Callable[[dict[str, float], History], tuple[float, str] | None]


def length_drift(row: dict[str, float], h: History) -> tuple[float, str] | None:
    pair = h.baseline_and_recent("response_length")
    if pair is None or pair[0] <= 0:
        return None
    base, recent = pair
    return recent / base - 1, f"response length {recent:.1f} tokens vs {base:.1f} at the start"


def length_jump(row: dict[str, float], h: History) -> tuple[float, str] | None:
    s = h.series("response_length")
    if len(s) < 2 or s[-2] <= 0:
        return None
    return s[-1] / s[-2] - 1, f"response length {s[-1]:.1f} tokens after {s[-2]:.1f}"


def entropy_collapse(row: dict[str, float], h: History) -> tuple[float, str] | None:
    key = "entropy" if "entropy" in row else "rollout/neg_logprob"
    pair = h.baseline_and_recent(key)
    if pair is None or pair[0] <= 0:
        return None
    base, recent = pair
    return 1 - recent / base, f"{key} {recent:.3f} vs {base:.3f} at the start"


def kl_acceleration(row: dict[str, float], h: History) -> tuple[float, str] | None:
    s, w = h.series("kl_ref"), h.window
    if len(s) < 2 * w + 1:
        return None
    recent, before = s[-1] - s[-1 - w], s[-1 - w] - s[-1 - 2 * w]
    return recent - before, f"kl_ref grew {recent:.3f} over {w} steps after {before:.3f}"


def reward_divergence(row: dict[str, float], h: History) -> tuple[float, str] | None:
    """Compares the two latest evaluations, and the training reward over the ``window``
    steps before each."""
    evals = [i for i, r in enumerate(h.rows) if "eval/accuracy" in r]
    if len(evals) < 2 or evals[-1] != len(h.rows) - 1:
        return None
    (a, b), w = evals[-2:], h.window

    def reward_before(i: int) -> float:
        got = [r["reward_mean"] for r in h.rows[max(0, i + 1 - w) : i + 1] if "reward_mean" in r]
        return _mean(got) if got else 0.0

    rise = reward_before(b) - reward_before(a)
    fall = h.rows[a]["eval/accuracy"] - h.rows[b]["eval/accuracy"]
    return min(rise, fall), f"training reward {rise:+.3f} while held-out accuracy {-fall:+.3f}"


@dataclass
class Dominance:
    """``component_dominance``: needs the components' weights and the correct reward."""

    weights: dict[str, float]
    correct: str

    def __call__(self, row: dict[str, float], h: History) -> tuple[float, str] | None:
        keys = {n: component_key(n) for n, w in self.weights.items() if w != 0}
        parts = {n: abs(self.weights[n] * row[k]) for n, k in keys.items() if k in row}
        total = sum(parts.values())
        if len(parts) < 2 or total <= 0:
            return None
        name = max((n for n in parts if n != self.correct), key=parts.get, default=None)
        if name is None:
            return None
        share = parts[name] / total
        return share, f"{name} is {share:.0%} of the reward"


@dataclass
class Judges:
    """``judge_saturation`` (the highest judge mean) and ``judge_disagreement``."""

    names: list[str]
    key: str  # "reward" (the mean) or "reward_disagreement"

    def __call__(self, row: dict[str, float], h: History) -> tuple[float, str] | None:
        keys = {n: component_key(n, self.key) for n in self.names}
        found = {n: row[k] for n, k in keys.items() if k in row}
        if not found:
            return None
        name = max(found, key=found.get)
        what = "mean score" if self.key == "reward" else "disagreement with the correct reward"
        return found[name], f"judge {name}: {what} {found[name]:.2f}"


def final_status(summary: dict[str, Any]) -> str:
    """``summary.json``'s status for a run that ran to its end: ``stopped_by_monitor``
    when a monitor's stop action ended it, else ``completed``."""
    return STOPPED if STOPPED in summary else "completed"


def is_judge(name: str) -> bool:
    """A component that scores with a model's opinion (``llm_judge#2`` too)."""
    base = name.split("#")[0]
    return base in JUDGES or base.endswith("_judge")


def statistics(weights: dict[str, float], correct: str) -> dict[str, Statistic]:
    """Each monitor's statistic, by its name in the ``monitors`` section."""
    judges = [n for n in weights if is_judge(n)]
    return {
        "length_drift": length_drift,
        "length_jump": length_jump,
        "component_dominance": Dominance(weights, correct),
        "entropy_collapse": entropy_collapse,
        "kl_acceleration": kl_acceleration,
        "reward_divergence": reward_divergence,
        "judge_saturation": Judges(judges, "reward"),
        "judge_disagreement": Judges(judges, "reward_disagreement"),
    }


class Monitors(StepHook):
    """The ``monitors`` section's checks after every step; see the module docstring.

    ``weights``: each reward component's weight by its reported name; ``correct``: the
    reward that judges correctness (``reward.correct_reward``)."""

    def __init__(
        self,
        cfg: MonitorsConfig,
        weights: dict[str, float],
        correct: str,
        pool: Pool,
        summary: dict[str, Any],
        log: logging.Logger,
        echo: Callable[[str], None] = print,
    ) -> None:
        stats = statistics(weights, correct)
        self.rules: list[tuple[str, Rule, Statistic]] = [
            (name, rule, stats[name])
            for name in stats
            if (rule := getattr(cfg, name)).enabled  # (a section's field, by its name)
        ]
        self.history = History(cfg.window)
        self.pool, self.summary, self.log, self.echo = pool, summary, log, echo

    def after_step(self, step: int, row: dict[str, float]) -> Decision:
        self.history.rows.append(dict(row))
        stop = None
        for name, rule, statistic in self.rules:
            got = statistic(row, self.history)
            if got is None:
                continue
            value, detail = got
            fired = value > rule.threshold
            row[f"monitor/{name}"], row[f"monitor_fired/{name}"] = value, float(fired)
            if fired:
                line = f"monitor {name} fired at step {step}: {detail} ({value:.3f} > "
                line += f"{rule.threshold}){'; stopping the run' if rule.action == 'stop' else ''}"
                self.log.warning(line)
                self.echo(f"streamrl: warning: {line}")
                stop = stop or (name if rule.action == "stop" else None)
        if stop is None:
            return Decision.CONTINUE
        self.summary[STOPPED] = stop
        return last_step(self.pool, self.summary, step)
