"""Weights staged from any thread and loaded between two engine steps.

Both built-in engines (``LocalEngine`` for language models, ``PolicyEngine`` for
environment policies) take new weights this way, so every step runs on exactly one
version. Who pays for loading them depends on the call:

- ``update_weights`` loads them at once when no step is running (an idle engine must
  report the new version), on the caller's thread;
- ``stage_weights`` only stages them; the engine's own thread loads them at its next
  step or when it calls ``apply_staged_weights`` between steps. The ``local`` backend
  publishes this way, so the trainer's thread never spends its time copying (and, with
  packed ``rollout.engine_weights``, re-packing) the rollout engine's weights.
"""

from __future__ import annotations

import threading

import torch


class WeightStaging:
    """Mixin: ``_load_weights(state_dict, version)`` is the engine's own loading, run
    while ``_busy`` is held (the lock its steps hold)."""

    _staged: tuple[dict[str, torch.Tensor], int] | None

    def _init_staging(self, busy: threading.Lock) -> None:
        self._busy = busy
        self._stage_lock = threading.Lock()  # guards _staged
        self._staged = None

    def _load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        raise NotImplementedError

    def stage_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Stages new weights, replacing any staged earlier, and returns at once. The
        tensors are copied when loaded: the caller must not modify them until then."""
        with self._stage_lock:
            self._staged = (state_dict, version)

    def apply_staged_weights(self) -> bool:
        """Loads staged weights now, on this thread, unless a step is running (that
        step's successor loads them). True if it loaded them."""
        if self._staged is None or not self._busy.acquire(blocking=False):
            return False
        try:
            with torch.inference_mode():
                return self._apply_staged()
        finally:
            self._busy.release()

    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Stages new weights; loaded at the next step boundary (now, if idle). Thread-safe.
        Sequences in flight keep their state and continue on the new weights."""
        self.stage_weights(state_dict, version)
        self.apply_staged_weights()

    @property
    def has_pending_weights(self) -> bool:
        """True between staging weights and the step boundary that loads them."""
        return self._staged is not None

    def _apply_staged(self) -> bool:
        """Loads the staged weights; the caller holds ``_busy``. Runs before every
        engine step, so the common case (nothing staged) takes no lock."""
        if self._staged is None:
            return False
        with self._stage_lock:
            staged, self._staged = self._staged, None
        if staged is None:
            return False
        self._load_weights(*staged)
        return True
