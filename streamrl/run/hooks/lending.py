"""``runtime.lend_cores``: while the trainer waits for a batch, its thread runs the
rollout engine's steps on every core (trainer's and rollout's), and stops as soon as a
batch is ready. Only at eta >= 1: a step's numbers depend on its thread count, and
eta = 0 stays bit-reproducible. Time-shared cores are the trainer's already."""

from __future__ import annotations

from streamrl.run.hooks.base import StepHook
from streamrl.run.hooks.time_sharing import Sharing
from streamrl.run.signals import GracefulStop
from streamrl.stream.pools import Pool
from streamrl.stream.sample_stream import SampleStream

DRIVEN_POLL_S = 0.005  # after driving: drive again as soon as work comes
LENDING_POLL_S = 0.1  # where driving does not apply (yet: steps not measured), look again


class LendCores(StepHook):
    def __init__(
        self,
        pool: Pool,
        stream: SampleStream,
        stop: GracefulStop,
        sharing: Sharing,
        threads: int,
    ) -> None:
        self.pool, self.stream, self.stop, self.sharing = pool, stream, stop, sharing
        self.threads = threads  # the trainer's and the rollout workers' threads together

    def while_waiting(self, step: int) -> float | None:
        if self.sharing.on:
            return None
        drove = self.pool.drive_engines(self.threads, self.batch_or_stop)
        return DRIVEN_POLL_S if drove else LENDING_POLL_S

    def batch_or_stop(self) -> bool:
        return self.stream.has_batch() or self.stop.requested
