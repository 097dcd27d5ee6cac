"""A rollout backend for the group sampler's tests: one real ``RolloutWorker`` (with the
sampler's worker side) run inline on each command, so the real rollout pool, worker and
sampler meet without threads of their own or an engine."""

from __future__ import annotations

import asyncio
import threading

import torch

from streamrl.config import load_config
from streamrl.core.messages import StartItems, VersionReport
from streamrl.core.types import Item, Trajectory
from streamrl.rollout.selection import GroupSampler
from streamrl.rollout.worker import RolloutWorker
from streamrl.stream.backends.base import Backend
from tests.tiny_run import algorithm_of


class InlineBackend(Backend):
    """One real ``RolloutWorker`` with the sampler's worker side, run inline on each
    command: 'w' items are answered all wrong, the others' samples right and wrong in
    turn (mixed groups)."""

    name, num_workers, restartable = "inline", 1, False

    def __init__(self, sampler: GroupSampler) -> None:
        self.reports: list = []
        self.lock = threading.Lock()
        self.engine = type("Engine", (), {"version": 0})()
        algorithm = algorithm_of(load_config(None, []))
        self.worker = RolloutWorker(
            self.engine, self.episode, algorithm, self.emit, group_size=4, seed=0, sampler=sampler
        )
        self.commands: list[StartItems] = []
        self.sent: list = []
        self.samples = 0

    async def episode(self, engine, item: Item, seed: int, greedy: bool = False) -> Trajectory:
        self.samples += 1
        one = torch.ones(1)
        reward = 0.0 if item.id.startswith("w") else float(self.samples % 2)
        return Trajectory(one.long(), one.bool(), one * 0, one.long() * 0, reward, item.index)

    def emit(self, report) -> None:
        self.reports.append((0, report))
        self.sent.append(report)

    def start(self) -> None:
        self.reports.append((0, VersionReport(0)))

    def send(self, worker: int, command) -> None:
        if isinstance(command, StartItems):
            with self.lock:
                self.commands.append(command)
                for group in self.worker.groups(command):
                    asyncio.run(group)

    def poll(self):
        with self.lock:
            out, self.reports = self.reports, []
            return out

    def dead(self):
        return {}

    def publish(self, state_dict, version: int) -> None:
        with self.lock:
            self.engine.version = version
            self.reports.append((0, VersionReport(version)))

    def close(self) -> None:
        pass
