"""Packed weights for the CPU inference engine (``rollout.engine_weights``).

Most of a decode step on CPU is its linear layers (see ``benchmarks/results/engine.md``).
Two packings replace the plain fp32 product (MKL's sgemm, slow at the 16-64 rows of a
decode step):

- ``float16`` packs every linear layer's weight in fp16 for FBGEMM, which converts it to
  fp32 inside the matrix kernel: half the bytes per step, fp32 activations and
  accumulation, outputs within ~2e-4 relative of fp32 (a next-token KL of ~4e-6 nats on
  SmolLM2).
- ``onednn`` keeps the weights in fp32 and reorders them into oneDNN's blocked layout,
  for its matrix product: fp32 throughout, outputs within ~1e-6 relative of MKL's (the
  order of the sums differs), and nearly twice as fast at 16 rows on an AVX2 core.

The engine then samples from a policy a little different from the fp32 trainer's (by
rounding alone for ``onednn``). Its log-probs stay exact for the distribution it sampled
from (they are the behaviour log-probs); the trainer reports the gap in ``mismatch/*``
and can correct it with ``algorithm.correction.kind`` (tis, mis, icepop), as bf16 / FP8
rollout engines do on GPUs.

(int8 weights with FBGEMM's per-tensor dynamic activations were measured too and
left out: on SmolLM2 they move the next-token distribution by ~2 nats of KL.)

The fp32 weights stay in the model: the state dict, weight updates and tied
embeddings work unchanged, and :func:`repack` re-packs them after every update.
"""

from __future__ import annotations

import itertools
import os
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

EngineWeights = Literal["float32", "float16", "onednn"]
PACKINGS = ("float16", "onednn")

# A large layer (a 49k-row vocabulary head) is packed in blocks of output rows: in
# isolation FBGEMM packed SmolLM2's head in 4096-row blocks in 0.52 s against 0.85 s
# whole, and the blocked forward over 16 rows took 18.9 ms against 22.3 ms.
ROWS_PER_BLOCK = 4096
# the batch size oneDNN lays a weight out for: a decode step's rows
ONEDNN_ROWS = 16


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` whose forward runs on a packed copy of its weight (``_kind``:
    ``float16`` or ``onednn``).

    Made by swapping the class of an existing ``nn.Linear`` (:func:`pack_linears`),
    so its parameters, state-dict keys and weight tying are those of the original.
    A copy (``copy.deepcopy``) leaves the packed blocks behind (oneDNN's cannot be
    copied) and packs its own from its fp32 weights when it first runs.
    """

    _packed: list[object]
    _kind: str
    _key: int  # in _LAYERS, for packed_linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and self.weight.requires_grad:
            return F.linear(x, self.weight, self.bias)  # packed weights have no gradient
        shape = x.shape  # fp32, as pack_linears checked: FBGEMM wants a contiguous 2-D input
        flat = x.reshape(-1, shape[-1]).contiguous()
        if torch.compiler.is_compiling():  # the packed weights are opaque to the compiler
            y = torch.ops.streamrl.packed_linear(flat, self._key, self.out_features)
        else:
            y = self.run_packed(flat)
        return y.reshape(*shape[:-1], y.shape[-1])

    def run_packed(self, flat: torch.Tensor) -> torch.Tensor:
        if "_packed" not in self.__dict__:  # a copy
            pack_all([self])
        if self._kind == "onednn":
            dnnl = torch.ops.mkldnn._linear_pointwise
            parts = [dnnl(flat, w, b, "none", [], "") for w, b in self._packed]
        else:
            parts = [torch.ops.quantized.linear_dynamic_fp16(flat, p) for p in self._packed]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_packed", None)
        return state


# Packed layers by key: a compiled decode step (rollout.compile) calls packed_linear with
# a layer's key, an int it can keep in its graph; the layer's packed weights are looked up
# at every call, so re-packing after a weight update needs no recompile.
_LAYERS: weakref.WeakValueDictionary[int, PackedLinear] = weakref.WeakValueDictionary()
_KEYS = itertools.count()


@torch.library.custom_op("streamrl::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, key: int, out_features: int) -> torch.Tensor:
    """x (N, in) fp32, contiguous -> (N, out_features) through layer ``key``'s packed
    weights."""
    return _LAYERS[key].run_packed(x)


@packed_linear.register_fake
def _(x: torch.Tensor, key: int, out_features: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], out_features))


def pack_linears(
    model: nn.Module,
    weights: EngineWeights,
    skip: Iterable[nn.Module] = (),
    executor: Executor | None = None,
) -> int:
    """Makes every ``nn.Linear`` of ``model`` but ``skip`` compute with ``weights``-precision
    weights (``skip``: layers the engine never runs, such as the projections it fuses).

    Returns how many layers were packed (0 for ``float32``). A model packed before (a
    second engine over it, or a deep copy of an engine's model, as the local backend
    gives its extra rollout workers) is first set back to plain ``nn.Linear`` layers, so
    that ``weights`` holds and every packed copy is built from the current fp32 weights.
    Raises a ValueError when the model is not an fp32 model on the CPU, or when this
    torch build has no FBGEMM kernels.
    """
    for m in model.modules():
        if isinstance(m, PackedLinear):
            m.__class__ = nn.Linear
            m.__dict__.pop("_packed", None)
    if weights == "float32":
        return 0
    if weights not in PACKINGS:
        raise ValueError(f"engine weights must be float32, float16 or onednn, got {weights!r}")
    param = next(model.parameters())
    if param.device.type != "cpu" or param.dtype != torch.float32:
        raise ValueError(
            f"engine weights={weights} packs fp32 CPU weights for a CPU kernel; this model is "
            f"{param.dtype} on {param.device.type}"
        )
    if weights == "float16" and "fbgemm" not in torch.backends.quantized.supported_engines:
        raise ValueError(f"engine weights={weights} needs FBGEMM, which this torch lacks")
    if weights == "onednn" and not torch.backends.mkldnn.is_available():
        raise ValueError(f"engine weights={weights} needs oneDNN, which this torch lacks")
    skipped = {id(m) for m in skip}
    linears = [m for m in model.modules() if type(m) is nn.Linear and id(m) not in skipped]
    pack_many(linears, weights, executor)
    return len(linears)


def pack_many(modules: Sequence[nn.Linear], kind: str, executor: Executor | None = None) -> None:
    """Swaps fp32 ``nn.Linear`` layers to :class:`PackedLinear` packed as ``kind``
    (``float16`` or ``onednn``), together (on ``executor``'s threads when given, see
    :func:`pack_all`)."""
    for module in modules:
        module.__class__ = PackedLinear
        module._kind = kind  # type: ignore[union-attr]
        if _LAYERS.get(getattr(module, "_key", -1)) is not module:  # new, or a deep copy
            # keys count up in packing order: an engine built the same way in another
            # process gets the same keys, so its compiled graph hits inductor's cache
            module._key = next(_KEYS)  # type: ignore[union-attr]
            _LAYERS[module._key] = module  # type: ignore[union-attr, assignment]
    pack_all(modules, executor)  # type: ignore[arg-type]


def pack_all(modules: Sequence[PackedLinear], executor: Executor | None = None) -> None:
    """(Re)packs each module's copy from its fp32 weight and bias, in blocks of
    ``ROWS_PER_BLOCK`` output rows.

    FBGEMM packs fp16 at ~10 ns a parameter on one core (~1.4 s for SmolLM2 at every
    weight update), and releases the GIL while it does, so the blocks of every module are
    spread over ``executor``'s threads when one is given. The result is the same either
    way.
    """
    jobs = [(m, lo) for m in modules for lo in range(0, m.weight.shape[0], ROWS_PER_BLOCK)]
    blocks = executor.map(_prepack, jobs) if executor is not None else map(_prepack, jobs)
    blocks = list(blocks)  # every block is built before any layer's packed list changes
    for m in modules:
        m._packed = []
    for (m, _), block in zip(jobs, blocks, strict=True):
        m._packed.append(block)


def _prepack(job: tuple[PackedLinear, int]) -> object:
    module, lo = job
    w = module.weight.detach()[lo : lo + ROWS_PER_BLOCK].float().contiguous()
    b = None if module.bias is None else module.bias.detach()[lo : lo + ROWS_PER_BLOCK]
    if module._kind == "onednn":  # oneDNN's blocked layout, chosen for decode-sized batches
        bias = None if b is None else b.float().contiguous()
        return torch.ops.mkldnn._reorder_linear_weight(w, ONEDNN_ROWS), bias
    with warnings.catch_warnings():  # FBGEMM's quantized ops warn they are deprecated
        warnings.simplefilter("ignore")
        return torch.ops.quantized.linear_prepack_fp16(
            w, None if b is None else b.float().contiguous()
        )


def pack_threads() -> int:
    """Threads for packing at a weight update: the cores this process may run on, at
    most 4 (the trainer may be busy on some of them; packing is short), and at most
    ``OMP_NUM_THREADS`` where that is set (Ray sets it to an actor's ``num_cpus``)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) > 0:
        n = min(n, int(omp))
    return max(1, min(4, n))


def repack(
    model: nn.Module, names: Iterable[str] | None = None, executor: Executor | None = None
) -> int:
    """Re-packs the packed layers whose weight or bias is among the parameter ``names``
    just loaded (all of them when ``names`` is None); returns how many it re-packed.

    Names are matched through storage, so a head tied to the embedding re-packs when
    only ``model.embed_tokens.weight`` arrives. (The trainer publishes its whole state
    dict, so a run re-packs every layer; a partial update re-packs only its layers.)
    """
    touched = loaded_by(model, names)
    modules = [m for m in model.modules() if isinstance(m, PackedLinear) and touched(m)]
    pack_all(modules, executor)
    return len(modules)


def loaded_by(model: nn.Module, names: Iterable[str] | None) -> Callable[[nn.Module], bool]:
    """A test of whether a module of ``model`` holds a parameter among ``names`` (every
    module when ``names`` is None). Matched through storage, so tied weights count."""
    if names is None:
        return lambda module: True
    params = dict(model.named_parameters(remove_duplicate=False))
    changed = {params[n].data_ptr() for n in names if n in params}
    return lambda module: any(p.data_ptr() in changed for p in module.parameters())
