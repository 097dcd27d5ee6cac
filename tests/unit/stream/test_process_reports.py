"""How commands and reports cross a process worker's pipes: tensors as plain arrays (not
torch's shared-memory handles), read by the pool without holding its books."""

from __future__ import annotations

import multiprocessing as mp
import threading

import torch

from streamrl.core.messages import GroupDone, StartItems, WorkerCrashed
from streamrl.core.types import Item, Trajectory
from streamrl.stream.backends import RolloutPool
from streamrl.stream.backends.process import _sender
from streamrl.stream.backends.wire import dumps
from streamrl.stream.sample_stream import SampleStream
from tests.unit.rollout.test_selection import ScriptedBackend, _keys


def _trajectory() -> Trajectory:
    ids = torch.arange(40).reshape(4, 10)[:, 3]  # a strided view of a larger tensor
    return Trajectory(
        input_ids=ids,
        loss_mask=torch.tensor([False, True, True, True]),
        behavior_logprobs=torch.tensor([0.0, -0.5, -0.25, -1.5]),
        versions=torch.tensor([-1, 3, 3, 4]),
        reward=1.0,
        item_index=7,
        metadata={"score": torch.tensor(0.5, dtype=torch.bfloat16), "text": "12"},
    )


def test_report_tensors_cross_the_pipe_as_plain_arrays() -> None:
    """Every tensor arrives equal (values, dtype, shape) and in this process's own memory:
    torch's reduction would have put each in shared memory behind a file descriptor."""
    r, w = mp.Pipe(duplex=False)
    sent = GroupDone(7, (_trajectory(), _trajectory()), 2.0, 8, rewards=(1.0, 0.0))
    _sender(w)(sent)
    got = r.recv()
    assert isinstance(got, GroupDone) and got.rewards == (1.0, 0.0)
    for a, b in zip(got.trajectories, sent.trajectories, strict=True):
        for name in ("input_ids", "loss_mask", "behavior_logprobs", "versions"):
            x, y = getattr(a, name), getattr(b, name)
            assert x.dtype == y.dtype and torch.equal(x, y)
            assert not x.is_shared()
        assert a.input_ids.tolist() == [3, 13, 23, 33]  # the view's elements only
        assert a.input_ids.untyped_storage().nbytes() == 4 * 8
        score = a.metadata["score"]  # no numpy dtype: torch's own pickling, still private
        assert score.dtype == torch.bfloat16 and score.item() == 0.5 and not score.is_shared()
        assert a.metadata["text"] == "12" and a.item_index == 7
    _sender(w)(WorkerCrashed("Traceback: boom"))
    assert r.recv() == WorkerCrashed("Traceback: boom")


def test_commands_carry_logged_transitions_the_same_way() -> None:
    """Offline items hold their transitions in the item: down the command pipe too."""
    r, w = mp.Pipe(duplex=False)
    obs = torch.randn(6, 3)
    item = Item(id="ep0", prompt="", answer=None, metadata={"transitions": {"obs": obs}})
    w.send_bytes(dumps(StartItems((item,))))
    got = r.recv()
    sent_obs = got.items[0].metadata["transitions"]["obs"]
    assert torch.equal(sent_obs, obs) and not sent_obs.is_shared() and not obs.is_shared()


class _SlowPipe(ScriptedBackend):
    """After a publish, its next poll lasts until the test says so, like a worker whose
    reports stream in."""

    def __init__(self) -> None:
        super().__init__()
        self.polling, self.go_on = threading.Event(), threading.Event()
        self.armed = self.waited_out = False

    def poll(self):
        if self.armed:
            self.armed = False
            self.polling.set()
            self.waited_out = not self.go_on.wait(timeout=60)
        return super().poll()

    def publish(self, state_dict, version: int) -> None:
        super().publish(state_dict, version)
        self.armed = True


def test_a_checkpoint_does_not_wait_for_a_poll_in_progress() -> None:
    """The trainer checkpoints the pool's books after every step; reading a worker's
    reports (the pump's poll) must not hold them, or each step waits for the worker."""
    stream = SampleStream(items_per_batch=2, max_staleness=1)
    backend = _SlowPipe()
    pool = RolloutPool(backend, stream, _keys())
    pool.start()
    try:
        pool.wait_version(0, timeout=60)
        pool.publish({}, 1)
        assert backend.polling.wait(timeout=60), "the pump never polled"
        state, _ = pool.checkpoint()  # under the pump's lock: waits until the 60 s pass
        assert not backend.go_on.is_set() and state["drawn"] >= 2
    finally:
        backend.go_on.set()
        pool.stop()
    assert not backend.waited_out
