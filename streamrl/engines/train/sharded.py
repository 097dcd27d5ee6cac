"""A train engine whose models are sharded over the ranks of a process group (FSDP2).

Built inside an initialised ``torch.distributed`` process group (gloo on CPU, NCCL on
CUDA), on every rank, from the same full model::

    engine = ShardedTrainEngine(model, lr=1e-5)          # on every rank
    if rank == 0:
        trainer = RankZero(engine)                       # the controller's trainer
        metrics = trainer.train_batch(batch, loss_fn)    # the followers run it too
        trainer.stop()
    else:
        follow(engine)                                   # until rank 0 says stop

Every model the engine holds is wrapped with ``fully_shard``, per decoder layer and then
the root: the policy, the frozen copies it makes (KL and DPO/A-LoL references) and the
value head. Mixed precision (bf16 parameters, fp32 gradient reduction) on CUDA, fp32 on
CPU.

The update is the one a single rank would apply. Every rank holds the same full batch
and runs its own rows of each minibatch (:func:`rank_rows`, uneven slices allowed). The
loss normaliser (``loss_fn.loss_weight``: tokens or sequences) is that of the whole
minibatch, over every rank and every micro-batch, so micro-batch k's loss is scaled by
u_k / U with U global; the gradients are then summed over ranks (the reduce-scatter's
divide factor is 1), which gives sum_k S_k / U: the one-piece gradient. Every rank runs
the same number of forwards and backwards (FSDP's collectives pair up): a rank with
fewer rows, or a micro-batch without loss tokens, runs a zero-weighted pass.

The forward is :class:`TrainEngine`'s: rows packed (a group's prompt once), the
vocabulary head on the loss tokens only. It calls the decoder and the head itself, so it
runs through the root's registered forward method (:func:`~.fsdp.root_call`), whose FSDP
hooks gather the root's own parameters (embeddings, norm, tied head) around it and hook
its outputs for the backward.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import DTensor

from streamrl.core.loss import LossFn
from streamrl.core.types import Batch
from streamrl.engines.train.dcp import DCP_FORMAT, full_state, load_full, load_sharded, save_sharded
from streamrl.engines.train.engine import TrainEngine, _to_device, _trimmed_length, slice_batch
from streamrl.engines.train.frozen import sharded_frozen_copy
from streamrl.engines.train.fsdp import default_mixed_precision, reshard, root_call, shard_model
from streamrl.engines.train.memory import training_state_bytes
from streamrl.engines.train.publish import gathered_state_dict, merge_lora_state
from streamrl.engines.train.ranks import RankZero, follow, rank_rows

__all__ = ["RankZero", "ShardedTrainEngine", "follow", "rank_rows", "shard_model"]


def _device_for_backend() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class ShardedTrainEngine(TrainEngine):
    """:class:`TrainEngine` with its models sharded over the default process group."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        mp_policy: MixedPrecisionPolicy | None = None,
        accumulate_unsharded: bool = False,
        reshard_after_forward: bool = True,
        **kwargs: Any,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("ShardedTrainEngine needs an initialised torch.distributed group")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        device = _device_for_backend()
        self.mesh = init_device_mesh(device.type, (self.world_size,))
        self.mp_policy = mp_policy or default_mixed_precision(device)
        # accumulate a minibatch's gradients unsharded, reduce-scattered once at its last
        # micro-batch: 1 reduce-scatter a step instead of one a micro-batch, for a full
        # (unsharded) gradient held while accumulating
        self.accumulate_unsharded = accumulate_unsharded
        for unsupported in ("batch_invariant", "compile_layers"):  # see docs/distributed.md
            if kwargs.pop(unsupported, False):
                raise ValueError(f"{unsupported} is not supported by the sharded trainer")
        kwargs.update(device=device)
        model = shard_model(
            model.to(device), self.mesh, self.mp_policy, reshard_after_forward=reshard_after_forward
        )
        super().__init__(model, batch_invariant=False, **kwargs)
        if self._sparse_embedding is not None:  # sparse gradients do not shard
            self.model.get_input_embeddings().sparse = False
            self._sparse_embedding = None
        self.owned: dict[str, torch.nn.Module] = {}  # frozen copies, by handle (ranks.py)

    # ----------------------------------------------------------------------------------
    # Models the algorithm owns
    # ----------------------------------------------------------------------------------

    def frozen_copy(self) -> torch.nn.Module:
        """A frozen sharded copy of the current policy (adapters merged), built on the
        meta device and filled shard by shard: no rank ever holds a full copy."""
        model = sharded_frozen_copy(self.model, self.mesh, self.mp_policy, self.device)
        handle = f"frozen-{len(self.owned)}"
        model._streamrl_handle = handle  # RankZero sends this name instead of the model
        self.owned[handle] = model
        return model

    def ensure_value_head(self) -> None:
        if self.value_head is None:
            head = torch.nn.Linear(self.model.config.hidden_size, 1)
            torch.nn.init.zeros_(head.weight)
            torch.nn.init.zeros_(head.bias)
            self.value_head = shard_model(head.to(self.device), self.mesh, self.mp_policy)
            self.add_trainable(head)

    # ----------------------------------------------------------------------------------
    # Forward passes over this rank's rows
    # ----------------------------------------------------------------------------------

    def _through_root(self, model: torch.nn.Module, fn: Any) -> dict[str, torch.Tensor]:
        return root_call(model, fn)  # the split forward inside the root's FSDP hooks

    def _my_rows(self, n: int) -> torch.Tensor:
        return rank_rows(n, self.rank, self.world_size)

    def _passes(self, n: int) -> int:
        """Micro-batches every rank runs for ``n`` rows: those of the largest slice."""
        largest = max(len(rank_rows(n, r, self.world_size)) for r in range(self.world_size))
        return -(-largest // self.micro_batch_sequences)

    def _rank_micro_batches(self, batch: Batch) -> list[Batch | None]:
        """This rank's micro-batches of ``batch``, padded with None to :meth:`_passes`."""
        rows = self._my_rows(batch.size)
        step = self.micro_batch_sequences
        out: list[Batch | None] = []
        for i in range(self._passes(batch.size)):
            part = rows[i * step : (i + 1) * step]
            if not len(part):
                out.append(None)
                continue
            length = _trimmed_length(batch.attention_mask[part])
            out.append(slice_batch(batch, part, length))
        return out

    def _gathered(self, batch: Batch, with_values: bool, model: torch.nn.Module) -> torch.Tensor:
        """(N, T) log-probs (or values) of every row, computed by its rank, on every rank."""
        n, t = batch.input_ids.shape
        mine = torch.zeros(len(self._my_rows(n)), t, dtype=torch.float32)
        done = 0
        for mb in self._rank_micro_batches(batch):
            if mb is None:  # this rank's rows are done: join the collectives on one row
                mb = slice_batch(batch, slice(0, 1), _trimmed_length(batch.attention_mask[:1]))
                self._forward(
                    model, _to_device(mb, self.device), with_entropy=False, with_values=with_values
                )
                continue
            res = self._forward(
                model, _to_device(mb, self.device), with_entropy=False, with_values=with_values
            )
            out = res["values" if with_values else "logprobs"].float().cpu()
            mine[done : done + mb.size, : out.shape[1]] = out
            done += mb.size
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, mine)
        return torch.cat(parts)

    @torch.no_grad()
    def compute_logprobs(self, batch: Batch, model: torch.nn.Module | None = None) -> torch.Tensor:
        model = self.model if model is None else model
        was_training = model.training
        model.eval()
        out = self._gathered(batch, False, model)
        model.train(was_training)
        return out.to(batch.behavior_logprobs.device)

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> torch.Tensor:
        was_training = self.model.training
        self.model.eval()
        out = self._gathered(batch, True, self.model)
        self.model.train(was_training)
        return out

    # ----------------------------------------------------------------------------------
    # Update
    # ----------------------------------------------------------------------------------

    def train_batch(
        self, batch: Batch, loss_fn: LossFn, *, num_minibatches: int = 1, epochs: int = 1
    ) -> dict[str, float]:
        metrics = super().train_batch(
            batch, loss_fn, num_minibatches=num_minibatches, epochs=epochs
        )
        metrics.update(self.memory_metrics())
        return metrics

    def memory_metrics(self) -> dict[str, float]:
        """Every rank's training-state bytes and peak RSS: ``rank<r>/param_bytes``,
        ``grad_bytes``, ``optim_bytes``, ``peak_rss_bytes`` (collective)."""
        parts: list[Any] = [None] * self.world_size
        reshard(self.model)  # count shards, not the parameters a forward left gathered
        dist.all_gather_object(parts, training_state_bytes(self))
        return {f"rank{r}/{k}": float(v) for r, part in enumerate(parts) for k, v in part.items()}

    def _train_minibatch(self, mini: Batch, loss_fn: LossFn) -> dict[str, float] | None:
        self.optimizer.zero_grad(set_to_none=True)
        total_units = loss_fn.loss_weight(mini)  # the whole minibatch: every rank, every mb
        if total_units == 0:
            return None  # the same on every rank: they all hold the whole batch
        sums: dict[str, float] = defaultdict(float)
        units_of: dict[str, float] = defaultdict(float)
        passes = self._rank_micro_batches(mini)  # as many on every rank
        for i, mb in enumerate(passes):
            self._gradient_sync(i == len(passes) - 1)
            units = 0 if mb is None else loss_fn.loss_weight(mb)
            if mb is None:
                mb = slice_batch(mini, slice(0, 1), _trimmed_length(mini.attention_mask[:1]))
            mb = _to_device(mb, self.device)
            with torch.enable_grad():
                outputs = self._forward(
                    self.model,
                    mb,
                    with_entropy=True,
                    entropy_grad=loss_fn.needs_entropy,
                    with_values=loss_fn.needs_values,
                )
                if units == 0:  # joins the collectives, adds nothing to the gradient
                    _zero_weighted(outputs).backward()
                    continue
                loss, mb_metrics = loss_fn(outputs, mb)
                (loss * (units / total_units)).backward()
            sums["loss"] += loss.item() * units / total_units
            for k, v in mb_metrics.items():
                sums[k] += float(v) * units
                units_of[k] += units
        grad_norm = self.step_optimizer()
        if grad_norm is None:
            return None
        stats = _reduced_metrics(sums, units_of, self.world_size)
        stats["grad_norm"] = float(grad_norm)
        return stats

    def _gradient_sync(self, last: bool) -> None:
        """Reduce-scatter this micro-batch's gradients: always, or only at the last one
        of the minibatch with ``accumulate_unsharded``, which also keeps the parameters
        gathered between its micro-batches (one all-gather a minibatch with
        ``reshard_after_forward=False``)."""
        if self.accumulate_unsharded:
            for model in (self.model, self.value_head):
                if model is not None:
                    model.set_requires_gradient_sync(last)
                    model.set_reshard_after_backward(last)

    def clip_gradients(self, max_norm: float) -> torch.Tensor:
        norm = torch.nn.utils.clip_grad_norm_(self.trainable, max_norm)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    # ----------------------------------------------------------------------------------
    # Checkpoints
    # ----------------------------------------------------------------------------------

    def checkpoint_state(self) -> dict[str, Any]:
        """The schedule and step; the weights and optimizer go to :meth:`save_sharded`
        (``model`` and ``optimizer`` say so)."""
        return {
            "format": DCP_FORMAT,
            "model": DCP_FORMAT,
            "optimizer": DCP_FORMAT,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "global_step": self.global_step,
        }

    def save_sharded(self, path: Any) -> None:
        """Collective: every rank writes its shards of weights and optimizer to ``path``."""
        save_sharded(self, path)

    def full_state(self) -> dict[str, Any]:
        """Full weights and optimizer state, keyed by name, on every rank (collective)."""
        return full_state(self)

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        """A sharded checkpoint (``dcp_dir``: written by any number of ranks) or an
        unsharded engine's ``checkpoint_state``, into this engine's shards."""
        if state.get("format") == DCP_FORMAT:
            load_sharded(self, state["dcp_dir"])
        else:
            load_full(self, state)
        if state["scheduler"] is not None and self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.global_step = state["global_step"]

    # ----------------------------------------------------------------------------------
    # Weights out
    # ----------------------------------------------------------------------------------

    def state_dict_for_inference(self) -> dict[str, torch.Tensor]:
        """The full weights on rank 0 ({} on the others), gathered one tensor at a time
        and copied to CPU before the next is gathered."""
        state = gathered_state_dict(reshard(self.model), keep=self.rank == 0)
        if self.is_lora and state:
            state = merge_lora_state(self.model, state)
        return state

    def save(self, path: Any, tokenizer: Any = None) -> None:
        """HF ``save_pretrained`` of the gathered weights, written by rank 0."""
        state = self.state_dict_for_inference()
        if self.rank != 0:
            return
        base = self.model.get_base_model() if self.is_lora else self.model
        with torch.device("meta"):
            shell = type(base)(copy.deepcopy(base.config))
        shell.save_pretrained(str(path), state_dict=state)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(path))


def _zero_weighted(outputs: dict[str, Any]) -> torch.Tensor:
    """0 x the sum of every output that carries a gradient: a backward through the same
    modules as a real loss's, adding zero."""
    total = None
    for value in outputs.values():
        if isinstance(value, torch.Tensor) and value.requires_grad:
            term = value.sum() * 0.0
            total = term if total is None else total + term
    return total


def _reduced_metrics(
    sums: dict[str, float], units: dict[str, float], world_size: int
) -> dict[str, float]:
    """Per-rank metric sums and units -> the whole minibatch's: unit-weighted means, and
    the loss (already scaled by the global units) summed."""
    parts: list[Any] = [None] * world_size
    dist.all_gather_object(parts, (dict(sums), dict(units)))
    total_sums: dict[str, float] = defaultdict(float)
    total_units: dict[str, float] = defaultdict(float)
    for part_sums, part_units in parts:
        for k, v in part_sums.items():
            total_sums[k] += v
        for k, v in part_units.items():
            total_units[k] += v
    stats = {k: total_sums[k] / total_units[k] for k in total_units if total_units[k]}
    stats["loss"] = total_sums.get("loss", 0.0)
    return stats
