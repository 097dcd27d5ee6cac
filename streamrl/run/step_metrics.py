"""Every per-step RL metric, gathered in one place (and the run's RL totals).

A row of ``metrics.jsonl`` holds: the trainer's loss diagnostics; the batch's
reward, accuracy and response length; staleness (min/mean/max and the count of
groups at each lag); tokens carried across weight updates; stage times
``time/*``; the stream's accounting ``stream/*``; the group sampler's own counters
and its metrics of the batch; the rollout side's mean reward
over every scored sample and summed per-episode counters; weight publish and
sync times; and throughput.
"""

from __future__ import annotations

import time
from typing import Any

from streamrl.algorithms.interleaved_sft import rl_rows
from streamrl.analysis.evaluate import is_correct
from streamrl.core.sample import Sample
from streamrl.core.types import Batch
from streamrl.rollout.selection.hints import hint_metrics
from streamrl.sources import item_correct_reward, item_domain
from streamrl.stream.pools import Pool
from streamrl.stream.sample_stream import Group, SampleStream, carried_metrics, staleness_metrics

# engine counters of work done: tokens generated (LM) or observations acted on (policy)
ENGINE_WORK = ("tokens_generated", "env_steps")


def component_key(name: str, kind: str = "reward") -> str:
    """The metric of a reward component (``llm_judge#2``: ``reward/llm_judge_2``; trackers
    such as MLflow take letters, digits and ``_-. /`` only)."""
    return f"{kind}/{name.replace('#', '_')}"


def component_metrics(trajectories: list[Any], correct_reward: str) -> dict[str, float]:
    """Each reward component's mean over the answers it scored (``reward/<name>``), and
    for every other component the fraction of the answers both scored on which it
    (>= 0.5) and ``correct_reward`` (>= 1) disagree (``reward_disagreement/<name>``): what
    the reward-hacking monitors read."""
    values: dict[str, list[float]] = {}
    disagree: dict[str, list[bool]] = {}
    for t in trajectories:
        comps = t.metadata.get("reward_components") or {}
        correct = comps.get(item_correct_reward(t, correct_reward))
        for name, v in comps.items():
            if v is None:
                continue
            values.setdefault(name, []).append(float(v))
            if correct is not None and name != correct_reward:
                disagree.setdefault(name, []).append((v >= 0.5) != (correct >= 1.0))
    m = {component_key(n): sum(v) / len(v) for n, v in values.items()}
    m.update(detail_metrics(trajectories))
    m.update(
        {component_key(n, "reward_disagreement"): sum(d) / len(d) for n, d in disagree.items()}
    )
    return m


def detail_metrics(trajectories: list[Any]) -> dict[str, float]:
    """Each group component's details (``metadata["reward_details"]``, a rubric's
    per-criterion scores) averaged over the answers that have them:
    ``reward/<component>/<name>``."""
    values: dict[str, list[float]] = {}
    for t in trajectories:
        for comp, details in (t.metadata.get("reward_details") or {}).items():
            for name, v in details.items():
                values.setdefault(f"{component_key(comp)}/{name}", []).append(float(v))
    return {k: sum(v) / len(v) for k, v in values.items()}


class StepMetrics:
    def __init__(self, correct_reward: str, group_size: int) -> None:
        self.correct_reward, self.group_size = correct_reward, group_size
        self.t_start = time.time()
        self.tokens = self.carried = 0
        self.waited = 0.0

    def row(
        self,
        step: int,
        groups: list[Group],
        batch: Batch,
        train_metrics: dict[str, float],
        timings: dict[str, float],
        stream: SampleStream,
        pool: Pool,
    ) -> dict[str, float]:
        """The metrics of RL step ``step`` (1-based: the weight version it produced)."""
        trajectories = [t for g in groups for t in g.trajectories]
        batch = rl_rows(batch)  # (interleaved demonstrations are not the policy's samples)
        self.waited += timings.get("time/wait_batch", 0.0)
        elapsed = max(time.time() - self.t_start, 1e-9)
        m: dict[str, Any] = dict(train_metrics)
        if trajectories[0].environment:
            m.update(self._segments(trajectories, elapsed))
        else:
            m.update(self._tokens(trajectories, groups, batch, elapsed, stream))
        m.update(staleness_metrics(groups, step - 1))  # the version that consumed the batch
        m.update(timings)
        m.update(stream.stats.as_metrics())
        m.update(pool.sampler.metrics())
        m.update(pool.sampler.batch_metrics(trajectories))
        m.update(pool.pop_rollout_stats())
        engines = pool.total_engine_stats()
        m["rollout/engine_steps"] = float(sum(v for k, v in engines.items() if k in ENGINE_WORK))
        m["rollout/driven_steps"] = float(engines.get("driven_steps", 0))  # runtime.lend_cores
        m["rollout/worker_restarts"] = pool.restarts
        m["rollout/reissued_items"] = pool.reissued
        m["time/weight_publish"] = pool.publish_s.get(step, 0.0)
        if step - 1 in pool.sync_latency:  # the previous version's, complete by now
            m["time/weight_sync_latency"] = pool.sync_latency[step - 1]
        return m

    def _segments(self, segments: list[Sample], elapsed: float) -> dict[str, float]:
        """Environment steps: the episodes that ended in the batch, and throughput; with
        logged data (offline RL), its transitions and their share of the batch."""
        logged = [s for s in segments if s.logged]
        played = [s for s in segments if not s.logged]
        steps = sum(s.num_generated for s in played)
        self.tokens += steps  # environment steps, for a run's totals
        returns = [r for s in played for r in s.episode_returns]
        lengths = [n for s in played for n in s.episode_lengths]
        m: dict[str, float] = {}
        if logged:
            n_logged = sum(s.step_rewards()[0] for s in logged)
            m["offline/transitions"] = float(n_logged)
            m["offline/fraction"] = n_logged / (n_logged + steps)
            m["offline/reward_mean"] = sum(s.step_rewards()[1] for s in logged) / n_logged
        m |= {
            "reward_mean": sum(s.step_rewards()[1] for s in played) / max(steps, 1),
            "env_steps": float(steps),
            "env_steps_total": float(self.tokens),
            "env_steps_per_s": self.tokens / elapsed,
            "episodes": float(len(returns)),
        }
        if returns:
            m.update(
                episode_return=sum(returns) / len(returns),
                episode_return_max=max(returns),
                episode_length=sum(lengths) / len(lengths),
            )
        return m

    def _tokens(self, trajectories, groups, batch, elapsed: float, stream) -> dict[str, float]:
        correct = [
            is_correct(t.metadata["reward_components"], item_correct_reward(t, self.correct_reward))
            for t in trajectories
        ]
        by_domain: dict[str, list[bool]] = {}
        for t, ok in zip(trajectories, correct, strict=True):
            if (domain := item_domain(t)) is not None:
                by_domain.setdefault(domain, []).append(ok)
        generated = batch.loss_mask.sum(1).float()  # (N,)
        self.tokens += int(generated.sum())
        carried = carried_metrics(groups)
        self.carried += int(carried["rollout/carried_tokens"])
        m: dict[str, Any] = {}
        m["reward_mean"] = float(batch.rewards.mean())
        m["reward_std"] = float(batch.rewards.std()) if batch.size > 1 else 0.0
        m["response_length"] = float(generated.mean())
        m["accuracy"] = sum(correct) / len(correct)
        m.update({f"accuracy/{d}": sum(v) / len(v) for d, v in by_domain.items()})
        m.update(carried)
        m["rollout/carried_tokens_total"] = self.carried
        m["tokens_per_s"] = self.tokens / elapsed
        m["samples_per_s"] = stream.stats.consumed * self.group_size / elapsed
        m.update(component_metrics(trajectories, self.correct_reward))
        m.update(hint_metrics(trajectories, batch.advantages))
        if bool(batch.loss_mask.any()):  # the sampled tokens' surprise: an entropy estimate
            m["rollout/neg_logprob"] = float(-batch.behavior_logprobs[batch.loss_mask].mean())
        return m

    def rl_seconds(self) -> float:
        """RL wall time so far, across resumes (``run.max_rl_seconds``)."""
        return time.time() - self.t_start

    def state(self) -> dict[str, float]:
        """Totals carried across a resume (checkpoints)."""
        return {
            "rl_time_s": self.rl_seconds(),
            "tokens": self.tokens,
            "carried": self.carried,
            "waited": self.waited,
        }

    def load_state(self, state: dict[str, float]) -> None:
        self.t_start = time.time() - state["rl_time_s"]
        self.tokens, self.carried = int(state["tokens"]), int(state["carried"])
        self.waited = state["waited"]

    def summary(self, pool: Pool, stream: SampleStream) -> dict[str, Any]:
        """RL totals for ``summary.json``."""
        out: dict[str, Any] = {
            "rl_time_s": self.rl_seconds(),
            "worker_restarts": pool.restarts,
            "reissued_items": pool.reissued,
            "resumed_items": pool.resumed_items,
            "carried_tokens": self.carried,
            "rl_tokens_consumed": self.tokens,
            # colocated: the time the engine had the cores (generation), the rest training
            "rl_wait_batch_s": self.waited,
            "engine": pool.total_engine_stats(),
            **stream.stats.as_metrics(),
            **pool.sampler.metrics(),
        }
        for key, values in (
            ("weight_sync_latency_s_mean", list(pool.sync_latency.values())),
            ("weight_publish_s_mean", list(pool.publish_s.values())),
        ):
            if values:
                out[key] = sum(values) / len(values)
        return out
