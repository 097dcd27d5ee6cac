"""How commands and reports cross a process boundary (process and Ray backends).

Tensors travel as plain arrays. torch's reduction for a multiprocessing pipe moves each
tensor into shared memory and hands its file descriptor over a socket, with an
authentication handshake per tensor; its default pickling writes each one with
``torch.save``. A batch of the main job (16 groups x 8 samples) carries 512 small
tensors: the first cost the rollout worker as much time as its decode steps, the second
~45 ms a batch against ~4 ms as arrays (benchmarks/results/async.md).
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch

_NUMPY_DTYPES = frozenset(
    (torch.bool, torch.uint8, torch.int32, torch.int64, torch.float16, torch.float32, torch.float64)
)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is torch.Tensor and obj.dtype in _NUMPY_DTYPES and not obj.requires_grad:
            return _tensor, (obj.numpy(force=True),)  # a view: only its elements
        return NotImplemented  # e.g. bfloat16: torch's own pickling


def _tensor(array: Any) -> torch.Tensor:
    return torch.from_numpy(array)


def dumps(message: Any) -> bytes:
    """A message (or a list of them) as bytes; ``pickle.loads`` (or a pipe's ``recv``)
    reads it back, tensors included."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(message)
    return buf.getvalue()


loads = pickle.loads
