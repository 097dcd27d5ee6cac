"""A LoRA training run (one Tinker training client): its adapter over the shared base, its
own AdamW, and the three calls that change it: ``forward_backward`` (gradients accumulate
in the adapter until) ``optim_step`` (AdamW on this adapter only, then gradients cleared).

Runs never touch each other: each holds its own adapter parameters and optimizer, and the
base weights are frozen. The service runs every run's calls on one thread, in the order
they arrived (the client sends them in its own order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from streamrl.algorithms.tinker_losses import LossInputError, resolve
from streamrl.stream.endpoint.tinker.adapters import (
    LoraSpec,
    adapter_parameters,
    with_adapter,
)
from streamrl.stream.endpoint.tinker.bases import BaseModel
from streamrl.stream.endpoint.tinker.wire import Datum, ForwardBackward

# positions one forward holds (datums are packed into chunks of at most this many)
CHUNK_TOKENS = 4096


@dataclass
class AdamStep:
    learning_rate: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


class Run:
    def __init__(self, model_id: str, base: BaseModel, spec: LoraSpec) -> None:
        self.model_id, self.base, self.spec = model_id, base, spec
        base_model, self.tokenizer = base.load()
        self.model = with_adapter(base_model, spec)
        self.model.train()  # no dropout in the adapters or the presets: the same numbers
        self.vocab = self.model.get_input_embeddings().num_embeddings
        self.params = list(adapter_parameters(self.model).values())
        self.optimizer = torch.optim.AdamW(self.params, lr=0.0)
        self.steps = 0

    # ----------------------------------------------------------------- the calls
    def forward_backward(self, call: ForwardBackward) -> tuple[list[dict], dict[str, float]]:
        """Per datum ``{"logprobs": (N,)}`` of its targets, and ``{"loss:sum": ...}``. With
        ``forward_only`` no gradient is kept."""
        try:
            loss_fn = resolve(call.loss_fn, set(call.data[0].inputs), call.config)
            for i, d in enumerate(call.data):
                self._check(i, d, set(call.data[0].inputs))
        except LossInputError as e:
            raise ValueError(str(e)) from None
        outputs: list[dict] = []
        total = 0.0
        for chunk in _chunks(call.data):
            lp, loss = self._chunk(chunk, loss_fn, call.forward_only)
            total += loss
            outputs += [{"logprobs": lp[j, : len(d.tokens)]} for j, d in enumerate(chunk)]
        return outputs, {"loss:sum": total}

    def optim_step(self, p: AdamStep) -> dict[str, float]:
        """One AdamW step of this run's adapter on the gradients accumulated since the last."""
        for group in self.optimizer.param_groups:
            group.update(
                lr=p.learning_rate,
                betas=(p.beta1, p.beta2),
                eps=p.eps,
                weight_decay=p.weight_decay,
            )
        grads = [q.grad for q in self.params if q.grad is not None]
        norm = (
            float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
            if grads
            else 0.0
        )
        if p.grad_clip_norm > 0:
            nn.utils.clip_grad_norm_(self.params, p.grad_clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return {"optim/grad_norm": norm, "optim/step": float(self.steps)}

    # ----------------------------------------------------------------- helpers
    def _check(self, i: int, d: Datum, names: set[str]) -> None:
        if set(d.inputs) != names:
            raise ValueError(
                f"data[{i}].loss_fn_inputs: {sorted(d.inputs)}; every datum of a call needs "
                f"the same inputs as data[0] ({sorted(names)})"
            )
        for what, ids in (("model_input", d.tokens), ("target_tokens", d.inputs["target_tokens"])):
            if len(ids) and (ids.min() < 0 or ids.max() >= self.vocab):
                raise ValueError(f"data[{i}].{what}: token ids are in [0, {self.vocab})")
        if len(d.tokens) > self.base.context:
            raise ValueError(
                f"data[{i}].model_input: {len(d.tokens)} tokens; the model holds "
                f"{self.base.context}"
            )

    def _chunk(self, data: list[Datum], loss_fn, forward_only: bool) -> tuple[np.ndarray, float]:
        n, t = len(data), max(len(d.tokens) for d in data)
        ids = torch.zeros((n, t), dtype=torch.long)
        mask = torch.zeros((n, t), dtype=torch.bool)
        inputs = {
            k: torch.zeros((n, t), dtype=torch.long if k == "target_tokens" else torch.float32)
            for k in data[0].inputs
        }
        for j, d in enumerate(data):
            m = len(d.tokens)
            ids[j, :m] = torch.from_numpy(d.tokens)
            mask[j, :m] = True
            for k, v in d.inputs.items():
                inputs[k][j, :m] = torch.from_numpy(v)
        with torch.set_grad_enabled(not forward_only):
            logits = self.model(input_ids=ids, attention_mask=mask.long()).logits.float()
            logprobs = torch.log_softmax(logits, -1).gather(-1, inputs["target_tokens"][..., None])[
                ..., 0
            ]
            logprobs = torch.where(mask, logprobs, 0.0)
            loss = loss_fn(logprobs, inputs, mask)
            if not forward_only:
                loss.backward()
        return logprobs.detach().numpy(), float(loss.detach())


def _chunks(data: list[Datum]) -> list[list[Datum]]:
    """Consecutive datums, at most ``CHUNK_TOKENS`` padded positions a forward."""
    out: list[list[Datum]] = []
    cur: list[Datum] = []
    longest = 0
    for d in data:
        longest_if = max(longest, len(d.tokens))
        if cur and longest_if * (len(cur) + 1) > CHUNK_TOKENS:
            out.append(cur)
            cur, longest_if = [], len(d.tokens)
        cur.append(d)
        longest = longest_if
    if cur:
        out.append(cur)
    return out
