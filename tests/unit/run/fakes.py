"""Stand-ins for the RL loop's collaborators: a pool that records every call, a stream
that hands out a batch after a few polls, a trainer, an algorithm and step metrics."""

from __future__ import annotations

from typing import Any

from streamrl.rollout.selection import GroupSampler


class FakePool:
    """Implements :class:`~streamrl.stream.pools.Pool`; ``calls`` lists what was called."""

    def __init__(self, log: list | None = None, drives: bool = False) -> None:
        self.calls: list[tuple] = [] if log is None else log
        self.drives = drives  # what drive_engines answers
        self.restarts = self.reissued = self.resumed_items = 0
        self.publish_s: dict[int, float] = {}
        self.sync_latency: dict[int, float] = {}
        self.until: Any = None  # drive_engines' stop condition, as given
        self.sampler = GroupSampler()  # the plain sampler: no counters

    def _note(self, *call: Any) -> None:
        self.calls.append(call)

    def start(self) -> None:
        self._note("start")

    def stop(self) -> None:
        self._note("stop")

    def wait_version(self, version: int, timeout: float | None = None) -> None:
        self._note("wait_version", version)

    def raise_if_failed(self) -> None:
        self._note("raise_if_failed")

    def admit(self, on: bool) -> None:
        self._note("admit", on)

    def pause_generation(self) -> None:
        self._note("pause_generation")

    def resume_generation(self) -> None:
        self._note("resume_generation")

    def work_ahead(self, on: bool) -> None:
        self._note("work_ahead", on)

    def finish_inflight(self) -> None:
        self._note("finish_inflight")

    def drive_engines(self, threads: int, until: Any) -> bool:
        self._note("drive_engines", threads)
        self.until = until
        return self.drives

    def publish(self, state_dict: dict, version: int) -> None:
        self._note("publish", version)

    def take_dropped(self) -> list:
        return []

    def checkpoint(self) -> tuple[dict, list]:
        self._note("checkpoint")
        return {"trainer_version": 0}, []

    def restore(self, state: dict) -> None:
        self._note("restore")

    def pop_rollout_stats(self) -> dict[str, float]:
        return {}

    def total_engine_stats(self) -> dict[str, float]:
        return {}


class FakeStream:
    """Each step's batch is ready after ``polls`` polls (None before)."""

    def __init__(self, log: list, polls: int = 1) -> None:
        self.log, self.polls, self.waited = log, polls, 0
        self.timeouts: list[float] = []
        self.batch = False

    def get_batch(self, timeout: float) -> list | None:
        self.log.append(("get_batch",))
        self.timeouts.append(timeout)
        self.waited += 1
        if self.waited < self.polls:
            return None
        self.waited = 0
        return ["group"]

    def has_batch(self) -> bool:
        return self.batch

    def set_trainer_version(self, version: int) -> None:
        self.log.append(("set_trainer_version", version))

    def close(self) -> None:
        self.log.append(("close",))


class FakeTrainer:
    def __init__(self, log: list) -> None:
        self.log = log

    def train_batch(self, batch: Any, loss_fn: Any, **options: Any) -> dict[str, float]:
        self.log.append(("train_batch", options))
        return {"loss": 0.5}

    def state_dict_for_inference(self) -> dict:
        return {}


class FakeAlgo:
    loss_fn = object()

    def __init__(self, log: list) -> None:
        self.log = log

    def observe_dropped(self, groups: list) -> None:
        pass

    def prepare(self, groups: list, trainer: Any, timer: Any) -> str:
        self.log.append(("prepare",))
        return "batch"


class FakeRecorder:
    def row(self, step, groups, batch, metrics, seconds, stream, pool) -> dict[str, float]:
        return {"step": float(step), **metrics, **seconds}


class FakeStop:
    def __init__(self) -> None:
        self.requested = False
        self.signum = 15
