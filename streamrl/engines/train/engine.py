"""Train engine: a causal LM plus its AdamW optimizer.

The algorithm is passed in, not built in (AReaL's engine API)::

    engine = TrainEngine(model)
    batch.proximal_logprobs = engine.compute_logprobs(batch)
    metrics = engine.train_batch(batch, make_rl_loss_fn("ppo_clip"), num_minibatches=2)
    inference_engine.update_weights(engine.state_dict_for_inference(), version + 1)

A loss is a :class:`~streamrl.core.loss.LossFn`: ``loss_fn(outputs, batch) -> (loss,
metrics)`` with outputs ``{"logprobs": (n, T), "entropy": (n, T)}`` for a micro-batch
(and ``"values"`` when it ``needs_values``); its ``loss_weight(batch)`` says how many
units (tokens, sequences) its loss averages over, ``needs_entropy`` whether the
entropy's autograd graph is kept, and ``after_step()`` runs after each optimizer step.

Gradient accumulation. A minibatch is cut into micro-batches; micro-batch k's loss
is a mean over its own u_k units, so it is scaled by u_k / U (U = units in the whole
minibatch) before backward. The sum is then sum_k (S_k / u_k) (u_k / U) = S / U: the
one-piece loss, hence the one-piece gradient, for token-mean and sequence-mean
aggregations alike. Dividing by the number of micro-batches instead would weight a
micro-batch with 3 loss tokens like one with 300.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from streamrl.core.loss import LossFn
from streamrl.core.types import Batch
from streamrl.engines import invariant
from streamrl.engines.inference.kv_cache import LLAMA_FAMILY, set_attn_impl
from streamrl.engines.train.optim import Optimized
from streamrl.engines.train.packing import pack, packed_hidden
from streamrl.models.lora import ALL_LINEAR, apply_lora, merged_state_dict


def slice_batch(batch: Batch, rows: slice | torch.Tensor, length: int | None = None) -> Batch:
    """Rows of a batch, and optionally only its first ``length`` positions."""
    out = {}
    for f in dataclasses.fields(batch):
        v = getattr(batch, f.name)
        if isinstance(v, torch.Tensor):
            v = v[rows]
            if length is not None and v.dim() == 2:
                v = v[:, :length]
        out[f.name] = v
    return Batch(**out)


def _trimmed_length(attention_mask: torch.Tensor) -> int:
    """Positions up to the last real token of any row: trailing all-pad columns are dropped."""
    real = attention_mask.any(0).nonzero()
    return int(real.max()) + 1 if real.numel() else 1


def _logprobs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, *, with_entropy: bool, entropy_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits (..., V), targets (...) -> log p(target) (...) and the entropy (...) | None,
    in float32. Without ``entropy_grad`` the entropy is computed outside autograd."""
    logits = logits.float()
    logp, lse = invariant.token_logprobs(logits, targets)
    if not with_entropy:
        return logp, None
    with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
        # H = -sum p log p = lse - sum p * logits
        return logp, lse - (logits.softmax(-1) * logits).sum(-1)


def token_logprobs_and_entropy(
    logits: torch.Tensor, input_ids: torch.Tensor, *, with_entropy: bool, entropy_grad: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits (n, T, V), input_ids (n, T) -> logprobs (n, T), entropy (n, T) | None.

    logprobs[:, t] = log p(input_ids[:, t] | input_ids[:, :t]); position 0 has no
    context and gets 0 (it is never a loss token). Computed in float32. Without
    ``entropy_grad`` the entropy is computed outside autograd (metrics only).
    """
    # logits at t-1 predict token t
    logp, entropy = _logprobs_and_entropy(
        logits[:, :-1], input_ids[:, 1:], with_entropy=with_entropy, entropy_grad=entropy_grad
    )
    return F.pad(logp, (1, 0)), None if entropy is None else F.pad(entropy, (1, 0))


# Causal LMs whose ``logits`` are exactly ``lm_head(model.model(...).last_hidden_state)``
# (no soft-capping or scaling after the head), so the head may run on chosen rows only.
_PLAIN_HEAD = frozenset(LLAMA_FAMILY)
# Below this vocabulary size the head runs on every position: its FLOPs are negligible
# there, and the one-piece forward keeps the tiny models' numerics (and runs) unchanged.
HEAD_ON_TARGETS_MIN_VOCAB = 4096


def _decoder_and_head(model: torch.nn.Module) -> tuple[Any, Any] | None:
    """(decoder, lm_head) of a plain-head causal LM (LoRA-wrapped or not) whose head is
    worth running on the loss tokens alone, else None."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(getattr(base, "config", None), "model_type", None) not in _PLAIN_HEAD:
        return None
    decoder, head = getattr(base, "model", None), base.get_output_embeddings()
    if decoder is None or head is None or head.weight.shape[0] < HEAD_ON_TARGETS_MIN_VOCAB:
        return None  # a small vocabulary's head costs little: keep the one-piece forward
    return decoder, head


def target_logprobs_and_entropy(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    input_ids: torch.Tensor,
    targets: torch.Tensor,
    *,
    with_entropy: bool,
    entropy_grad: bool = True,
    batch_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Like ``token_logprobs_and_entropy`` from the last hidden states (n, T, H), but
    the vocabulary head runs only where ``targets`` (n, T) bool is True (the loss
    tokens); elsewhere logprobs and entropy are 0. On a chat prompt of 40 tokens and a
    completion of 5, that skips ~90% of the (tokens x vocabulary) head.
    ``batch_invariant``: the head runs on a multiple of ``invariant.ROWS`` rows."""
    n, t = input_ids.shape
    sel = targets[:, 1:]  # token t is predicted from position t - 1
    rows = hidden[:, :-1][sel]
    k = rows.shape[0]
    # (K,) each, K = the loss tokens
    lp, ent = _logprobs_and_entropy(
        head(invariant.pad_rows(rows))[:k] if batch_invariant else head(rows),
        input_ids[:, 1:][sel],
        with_entropy=with_entropy,
        entropy_grad=entropy_grad,
    )
    zeros = lp.new_zeros(n, t - 1)

    def spread(x: torch.Tensor) -> torch.Tensor:  # (K,) -> (n, T), 0 off the loss tokens
        return F.pad(zeros.masked_scatter(sel, x), (1, 0))

    return spread(lp), None if ent is None else spread(ent)


def _sparse_tied_embedding(model: torch.nn.Module) -> torch.nn.Parameter | None:
    """Makes a trained input embedding tied to the output head (SmolLM2, Qwen, Gemma)
    send a sparse gradient; returns the tied weight, or None when there is none.

    A dense embedding backward zero-fills a (vocabulary x width) gradient and scatters the
    batch's few hundred rows into it; autograd then adds that to the head's own dense
    gradient of the same weight. For SmolLM2 that is two passes over 113 MB a micro-batch.
    Sparse, only the looked-up rows are added: the update takes 0.93x the time
    (``benchmarks/bench_train_step.py --variants default dense-embed``). The gradient
    is the same (the sum of the same terms); a step whose head took no part would leave
    it sparse, and the engine turns it dense before the optimizer step.

    CPU only: that is where it was measured, and on a GPU the dense passes cost ~0.1 ms.
    """
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    if not isinstance(embed, torch.nn.Embedding) or head is None:
        return None
    w = embed.weight
    if w is not head.weight or not w.requires_grad or w.device.type != "cpu":
        return None
    embed.sparse = True
    return w


def compile_decoder_layers(model: torch.nn.Module) -> int:
    """``torch.compile`` every decoder layer in place (``train.compile``), with dynamic
    shapes, since packed lengths vary from batch to batch. The layers share one compiled
    graph, parameter names and the state dict are unchanged, and the first forward and
    backward pay the compile. Returns how many layers were compiled."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(getattr(base, "model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise ValueError(
            f"train.compile: {type(base).__name__} has no decoder layers at .model.layers"
        )
    for layer in layers:
        layer.compile(dynamic=True)
    return len(layers)


class TrainEngine(Optimized):
    """A causal LM and an AdamW over its trainable parameters."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.95),
        max_grad_norm: float | None = 1.0,
        micro_batch_sequences: int = 16,
        device: str | torch.device = "cpu",
        head_on_targets: bool = True,
        packed: bool = True,
        fused: bool = True,
        compile_layers: bool = False,
        keep_freed_memory: bool = True,
        batch_invariant: bool = False,
    ) -> None:
        self.head_on_targets = head_on_targets
        # batch-invariant forwards (rollout.batch_invariant): the batch-invariant engine's
        # numbers for every token, so that equal weights give equal log-probs on both
        # sides (mismatch/kl = 0)
        self.batch_invariant = batch_invariant
        if batch_invariant:
            set_attn_impl(model, invariant.ATTN_IMPL)
        self.packed = packed
        if micro_batch_sequences < 1:
            raise ValueError(f"micro_batch_sequences must be >= 1, got {micro_batch_sequences}")
        super().__init__(
            model,
            lr=lr,
            weight_decay=weight_decay,
            betas=betas,
            max_grad_norm=max_grad_norm,
            device=device,
            fused=fused,
            keep_freed_memory=keep_freed_memory,
        )
        self.micro_batch_sequences = micro_batch_sequences
        self.value_head: torch.nn.Module | None = None  # a critic on the LM (PPO with GAE)
        self._sparse_embedding = _sparse_tied_embedding(self.model)
        if compile_layers:
            compile_decoder_layers(self.model)

    def frozen_copy(self) -> torch.nn.Module:
        """A frozen copy of the current policy (adapters merged): e.g. a KL reference."""
        model = copy.deepcopy(self.model)
        if self.is_lora:
            model = model.merge_and_unload()
        model.eval().requires_grad_(False)
        return model

    def ensure_value_head(self) -> None:
        """A critic on the LM's last hidden state (PPO with a learned critic): a linear
        head, zero-initialised and trained with the model; one already here is kept."""
        if self.value_head is None:
            head = torch.nn.Linear(self.model.config.hidden_size, 1)
            torch.nn.init.zeros_(head.weight)
            torch.nn.init.zeros_(head.bias)
            self.value_head = head
            self.add_trainable(head)

    @classmethod
    def from_lora(
        cls,
        model: torch.nn.Module,
        r: int = 8,
        alpha: float = 16,
        target_modules: str | list[str] = ALL_LINEAR,
        *,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> TrainEngine:
        """Wrap ``model`` with peft LoRA adapters; only the adapters are trained."""
        peft_model = apply_lora(
            model, r=r, alpha=alpha, dropout=dropout, target_modules=target_modules
        )
        return cls(peft_model, **kwargs)

    @property
    def is_lora(self) -> bool:
        return hasattr(self.model, "peft_config")

    # ----------------------------------------------------------------------------------
    # Forward
    # ----------------------------------------------------------------------------------

    def _forward(
        self,
        model: torch.nn.Module,
        mb: Batch,
        *,
        with_entropy: bool,
        entropy_grad: bool = False,
        with_values: bool = False,
    ) -> dict[str, torch.Tensor]:
        """mb already on self.device -> {"logprobs": (n, T), "entropy": (n, T) | None,
        and with ``with_values`` "values": (n, T)}: values[:, t] is the value head's
        V(tokens < t), the state in which token t is chosen (0 at t = 0). With
        ``head_on_targets`` and a plain-head model, logprobs and entropy are computed
        on the loss tokens only (0 elsewhere); with ``packed`` as well (and no values),
        the rows are packed without padding and a prompt shared by several rows is
        computed once (``packing``), when that saves enough. ``batch_invariant``: the
        positions are padded to a multiple of ``invariant.ROWS``, so that every product
        runs on whole row blocks and attention on whole key blocks, as in the engine."""
        if self.batch_invariant:
            t = mb.input_ids.shape[1]
            pad = invariant.round_up(t, invariant.ROWS) - t
            if pad:
                widened = {
                    name: F.pad(getattr(mb, name), (0, pad))
                    for name in ("input_ids", "attention_mask", "loss_mask")
                }
                out = self._forward_body(
                    model,
                    dataclasses.replace(mb, **widened),
                    with_entropy=with_entropy,
                    entropy_grad=entropy_grad,
                    with_values=with_values,
                )
                return {k: None if v is None else v[:, :t] for k, v in out.items()}
        return self._forward_body(
            model,
            mb,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            with_values=with_values,
        )

    def _forward_body(
        self,
        model: torch.nn.Module,
        mb: Batch,
        *,
        with_entropy: bool,
        entropy_grad: bool = False,
        with_values: bool = False,
    ) -> dict[str, torch.Tensor]:
        """:meth:`_forward`'s work, on positions already padded when batch-invariant."""
        parts = _decoder_and_head(model) if self.head_on_targets else None
        if parts is not None:
            result = self._through_root(
                model,
                lambda: self._split_forward(
                    *parts,
                    mb,
                    with_entropy=with_entropy,
                    entropy_grad=entropy_grad,
                    packed=self.packed and not with_values,
                ),
            )
            hidden = result.pop("hidden")
            return self._with_values(result, hidden, with_values)
        out = model(
            input_ids=mb.input_ids,
            attention_mask=mb.attention_mask.long(),
            use_cache=False,
            output_hidden_states=with_values,
        )
        logp, entropy = token_logprobs_and_entropy(
            out.logits, mb.input_ids, with_entropy=with_entropy, entropy_grad=entropy_grad
        )
        hidden = out.hidden_states[-1] if with_values else None
        return self._with_values({"logprobs": logp, "entropy": entropy}, hidden, with_values)

    def _through_root(self, model: torch.nn.Module, fn: Any) -> dict[str, torch.Tensor]:
        """``fn()``: a forward that calls ``model``'s decoder and head itself. A sharded
        engine runs it inside the root module's forward hooks (its gather and release)."""
        return fn()

    def _split_forward(
        self,
        decoder: torch.nn.Module,
        head: torch.nn.Module,
        mb: Batch,
        *,
        with_entropy: bool,
        entropy_grad: bool,
        packed: bool,
    ) -> dict[str, torch.Tensor]:
        """The decoder (packed when ``packed`` and it saves enough), then the head on the
        loss tokens only: {"logprobs", "entropy", "hidden": the last hidden states}."""
        layout = None
        if packed:
            layout = pack(
                mb.input_ids,
                mb.attention_mask,
                mb.loss_mask,
                decoder.config.hidden_size,
                batch_invariant=self.batch_invariant,
            )
        if layout is not None:
            hidden = packed_hidden(decoder, layout, *mb.input_ids.shape)
        else:
            hidden = decoder(
                input_ids=mb.input_ids,
                attention_mask=mb.attention_mask.long(),
                use_cache=False,
            ).last_hidden_state
        logp, entropy = target_logprobs_and_entropy(
            hidden,
            head,
            mb.input_ids,
            mb.loss_mask,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            batch_invariant=self.batch_invariant,
        )
        return {"logprobs": logp, "entropy": entropy, "hidden": hidden}

    def _with_values(
        self, result: dict[str, Any], hidden: torch.Tensor | None, with_values: bool
    ) -> dict[str, Any]:
        if with_values:
            if self.value_head is None:
                raise ValueError("the loss needs values but the engine has no value head")
            v = self.value_head(hidden.float()).squeeze(-1)  # (n, T)
            result["values"] = F.pad(v[:, :-1], (1, 0))
        return result

    def _micro_slices(self, n: int) -> list[slice]:
        step = self.micro_batch_sequences
        return [slice(i, min(i + step, n)) for i in range(0, n, step)]

    @torch.no_grad()
    def compute_logprobs(self, batch: Batch, model: torch.nn.Module | None = None) -> torch.Tensor:
        """(N, T) log-probs of ``batch.input_ids`` under ``model`` (default: the trained one).

        Used for proximal logprobs (current weights, before the update) and, with a
        frozen reference model, for reference logprobs. Runs in eval mode (no dropout).
        """
        model = self.model if model is None else model
        was_training = model.training
        model.eval()
        n, t = batch.input_ids.shape
        out = torch.zeros(n, t, dtype=torch.float32)
        for rows in self._micro_slices(n):
            length = _trimmed_length(batch.attention_mask[rows])
            mb = _to_device(slice_batch(batch, rows, length), self.device)
            out[rows, :length] = self._forward(model, mb, with_entropy=False)["logprobs"].cpu()
        model.train(was_training)
        return out.to(batch.behavior_logprobs.device)

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> torch.Tensor:
        """(N, T) values of the value head (see ``_forward``), in eval mode."""
        was_training = self.model.training
        self.model.eval()
        n, t = batch.input_ids.shape
        out = torch.zeros(n, t, dtype=torch.float32)
        for rows in self._micro_slices(n):
            length = _trimmed_length(batch.attention_mask[rows])
            mb = _to_device(slice_batch(batch, rows, length), self.device)
            res = self._forward(self.model, mb, with_entropy=False, with_values=True)
            out[rows, :length] = res["values"].cpu()
        self.model.train(was_training)
        return out

    # ----------------------------------------------------------------------------------
    # Update
    # ----------------------------------------------------------------------------------

    def train_batch(
        self, batch: Batch, loss_fn: LossFn, *, num_minibatches: int = 1, epochs: int = 1
    ) -> dict[str, float]:
        """One optimizer step per minibatch; micro-batches accumulate exact gradients.

        Returns loss, grad_norm and the loss_fn metrics (each averaged over
        minibatches; loss_fn metrics weighted by loss units within a minibatch),
        lr, tokens (loss tokens in the batch), steps, and skipped_steps (minibatches
        without loss tokens or with a non-finite gradient; no step is taken).
        """
        n = batch.size
        if not 1 <= num_minibatches <= n:
            raise ValueError(f"num_minibatches must be in [1, {n}], got {num_minibatches}")

        self.model.train()
        lr = float(self.optimizer.param_groups[0]["lr"])  # this batch's (first) step
        sums: dict[str, float] = defaultdict(float)
        steps = skipped = 0
        passes = [
            rows for _ in range(epochs) for rows in torch.arange(n).tensor_split(num_minibatches)
        ]
        for rows in passes:  # ``epochs`` passes, each of ``num_minibatches`` steps
            mini = slice_batch(batch, rows)
            stats = self._train_minibatch(mini, loss_fn)
            if stats is None:
                skipped += 1
                continue
            steps += 1
            loss_fn.after_step()
            for k, v in stats.items():
                sums[k] += v

        metrics = {k: v / steps for k, v in sums.items()} if steps else {}
        metrics.update(
            lr=lr,
            tokens=float(batch.loss_mask.sum()),
            steps=float(steps),
            skipped_steps=float(skipped),
        )
        return metrics

    def _train_minibatch(self, mini: Batch, loss_fn: LossFn) -> dict[str, float] | None:
        self.optimizer.zero_grad(set_to_none=True)
        total_units = loss_fn.loss_weight(mini)
        if total_units == 0:
            return None

        loss_sum = 0.0
        metric_sums: dict[str, float] = defaultdict(float)
        metric_units: dict[str, float] = defaultdict(float)
        for rows in self._micro_slices(mini.size):
            mb = slice_batch(mini, rows, _trimmed_length(mini.attention_mask[rows]))
            units = loss_fn.loss_weight(mb)
            if units == 0:  # no loss tokens: contributes nothing to loss or gradient
                continue
            mb = _to_device(mb, self.device)
            with torch.enable_grad():
                outputs = self._forward(
                    self.model,
                    mb,
                    with_entropy=True,
                    entropy_grad=loss_fn.needs_entropy,
                    with_values=loss_fn.needs_values,
                )
                loss, mb_metrics = loss_fn(outputs, mb)
                (loss * (units / total_units)).backward()
            loss_sum += loss.item() * units / total_units
            for k, v in mb_metrics.items():
                metric_sums[k] += float(v) * units
                metric_units[k] += units

        tied = self._sparse_embedding
        if tied is not None and tied.grad is not None and tied.grad.is_sparse:
            tied.grad = tied.grad.to_dense()  # no head gradient joined it (see above)
        grad_norm = self.step_optimizer()
        if grad_norm is None:
            return None
        stats = {k: metric_sums[k] / metric_units[k] for k in metric_sums}
        stats.update(loss=loss_sum, grad_norm=float(grad_norm))
        return stats

    # ----------------------------------------------------------------------------------
    # Weights out
    # ----------------------------------------------------------------------------------

    def state_dict_for_inference(self) -> dict[str, torch.Tensor]:
        """Detached CPU copies of the weights, keyed like the base architecture.

        With LoRA, each adapted weight is W + scale * B @ A, computed without touching
        the trained model (merge-then-unmerge would drift the base weights in float).
        """
        return merged_state_dict(self.model)

    def save(self, path: str | Path, tokenizer: Any = None) -> None:
        """HF ``save_pretrained`` (safetensors) of the (merged) weights, plus the tokenizer."""
        from transformers.utils import logging as hf_logging

        base = self.model.get_base_model() if self.is_lora else self.model
        shown = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # no "Writing model shards" bar in the run's log
        try:
            base.save_pretrained(str(path), state_dict=self.state_dict_for_inference())
        finally:
            if shown:
                hf_logging.enable_progress_bar()
        if tokenizer is not None:
            tokenizer.save_pretrained(str(path))


def _to_device(batch: Batch, device: torch.device) -> Batch:
    moved = {}
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, torch.Tensor):
            moved[f.name] = value.to(device)
    return dataclasses.replace(batch, **moved)
