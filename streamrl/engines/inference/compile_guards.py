"""What a compiled decode step (``rollout.compile``, ``LlamaSlotRunner.decode_all``)
keeps of torch.compile's machinery: the guards worth checking at every call, and a code
object of its own per runner."""

from __future__ import annotations

import types
from typing import Any

from torch import nn

# torch state a compiled step is only valid under (cheap guards, kept)
_STATE_GUARDS = {
    "GLOBAL_STATE",
    "GRAD_MODE",
    "DEFAULT_DEVICE",
    "DETERMINISTIC_ALGORITHMS",
    "TORCH_FUNCTION_STATE",
    "AUTOGRAD_SAVED_TENSORS_HOOKS",
}


def guards_kept(entries: list[Any]) -> list[bool]:
    """A compiled decode step's guards: its input tensors' (not the parameters') and
    torch's global state (``guard_filter_fn``)."""
    return [
        (e.guard_type == "TENSOR_MATCH" and not isinstance(e.value, nn.Parameter))
        or e.guard_type in _STATE_GUARDS
        for e in entries
    ]


def own_code(method: Any) -> Any:
    """``method`` with a copy of its code object: torch.compile keeps its graphs (and
    counts recompiles) per code object, so this gives the bound object its own."""
    fn = method.__func__
    code = fn.__code__.replace()
    fresh = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    return types.MethodType(fresh, method.__self__)
