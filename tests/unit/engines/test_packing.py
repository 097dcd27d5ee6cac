"""The trainer's packed forward (no padding, a group's prompt computed once) gives the
padded forward's logprobs, loss and gradients, and is used only when it pays."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import streamrl.engines.train.engine as train
from streamrl.algorithms import make_rl_loss_fn
from streamrl.core.types import Batch, GenerationResult
from streamrl.engines.train.engine import TrainEngine
from streamrl.engines.train.packing import pack
from streamrl.rollout.episodes.single_turn import trajectory_from_result
from tests.unit.engines.test_train_engine import CONFIG


def grouped_batch(prompts=((5, 9, 3, 7, 2, 8, 4, 6), (11, 12, 13, 14, 15)), per=4, seed=0):
    """Collated rows: each prompt (of a different length) repeated ``per`` times, then
    a random completion of 1..4 tokens (the loss tokens)."""
    g = torch.Generator().manual_seed(seed)
    trajectories = []
    for k, prompt in enumerate(prompts):
        for _ in range(per):
            c = torch.randint(1, 64, (int(torch.randint(1, 5, (1,), generator=g)),), generator=g)
            logp = (-4.0 + 0.1 * torch.randn(len(c), generator=g)).tolist()
            result = GenerationResult(list(prompt), c.tolist(), logp, [0] * len(c), "stop")
            trajectories.append(trajectory_from_result(result, 0.0, k, {}))
    batch = Batch.collate(trajectories)
    batch.advantages = torch.where(batch.loss_mask, torch.randn(batch.size, 1, generator=g), 0.0)
    return batch


@pytest.fixture()
def head_on_targets(monkeypatch):
    """Take the vocabulary-head path (where sharing lives) with a tiny vocabulary."""
    monkeypatch.setattr("streamrl.engines.train.engine.HEAD_ON_TARGETS_MIN_VOCAB", 0)


def test_layout_puts_each_prompt_once_then_each_rows_own_tokens():
    batch = grouped_batch()
    lay = pack(batch.input_ids, batch.attention_mask, batch.loss_mask, width=32)
    assert lay is not None and lay.shared_prompts == 6  # 8 rows, 2 prompts
    own = batch.loss_mask.sum(1).tolist()  # every row's own tokens are its completion
    assert lay.tokens == 8 + 5 + sum(own)
    flat = lay.ids[0].tolist()
    assert flat[:13] == [5, 9, 3, 7, 2, 8, 4, 6, 11, 12, 13, 14, 15]
    # row 0's completion follows, at positions 8.. (it continues prompt a)
    assert flat[13 : 13 + own[0]] == batch.input_ids[0, 8 : 8 + own[0]].tolist()
    assert lay.pos[0, :13].tolist() == [*range(8), *range(5)]
    assert lay.pos[0, 13 : 13 + own[0]].tolist() == list(range(8, 8 + own[0]))
    m = lay.mask[0, 0]
    first = 13  # row 0's first own token sees prompt a and itself, not prompt b
    assert m[first, :8].all() and not m[first, 8:13].any() and m[first, first]
    assert not m[first, first + 1 :].any()  # nor any later token
    row4 = 13 + sum(own[:4])  # row 4 (prompt b) sees prompt b, not prompt a or row 0
    assert m[row4, 8:13].all() and not m[row4, :8].any() and not m[row4, 13:row4].any()
    assert not m[3, 4:].any() and m[3, :4].all()  # a prompt is causal in itself
    # the state before each row's first own token is its prompt's last
    assert lay.src[:4].tolist() == [7] * 4 and lay.src[4:8].tolist() == [12] * 4
    assert lay.col[:8].tolist() == [7] * 4 + [4] * 4


def test_layout_is_used_when_its_estimated_flops_are_lower():
    # equal lengths, no shared prompt: nothing to save, and the dense mask costs more
    ids = torch.randint(1, 64, (4, 31))
    att, loss = torch.ones(4, 31, dtype=torch.bool), torch.ones(4, 31, dtype=torch.bool)
    loss[:, :3] = False
    assert pack(ids, att, loss, width=4096, min_saving=0.0) is None
    # the rows share their 3-token prompt: 9 of 124 positions saved (7%)
    ids[:, :3] = torch.tensor([5, 6, 7])
    assert pack(ids, att, loss, width=4096, min_saving=0.05) is not None
    assert pack(ids, att, loss, width=4096) is None  # under the default 20%
    assert pack(ids, att, loss, width=4096, min_saving=0.05, max_tokens=100) is None
    # a narrow model: attention over the 115 packed positions outweighs the saving
    # (115 * 6 * 8 + 115^2 = 18,745 against 124 * 6 * 8 + 4 * 31^2 = 9,796)
    assert pack(ids, att, loss, width=8, min_saving=0.0) is None
    # padding alone can pay: two short rows among long ones
    att[0, 10:] = False
    att[1, 4:] = False
    assert pack(ids, att, loss & att, width=4096) is not None
    # left padding is not what collate makes: decline rather than guess
    left = torch.ones(4, 31, dtype=torch.bool)
    left[0, 0] = False
    assert pack(ids, left, loss & left, width=4096, min_saving=0.0) is None


def _update(batch, packed, micro_batch_sequences=8):
    torch.manual_seed(0)
    engine = TrainEngine(
        LlamaForCausalLM(LlamaConfig(**{**CONFIG, "vocab_size": 64})),
        micro_batch_sequences=micro_batch_sequences,
        packed=packed,
    )
    engine.optimizer = torch.optim.SGD(engine.trainable, lr=0.1)
    logp = engine.compute_logprobs(batch)
    batch = copy.copy(batch)
    batch.proximal_logprobs = logp
    loss_fn = make_rl_loss_fn("ppo_clip", entropy_coef=0.01)
    metrics = engine.train_batch(batch, loss_fn)
    grads = {n: p.grad.clone() for n, p in engine.model.named_parameters()}
    return logp, metrics, grads


@pytest.mark.parametrize("micro_batch_sequences", [8, 3])
def test_packed_forward_gives_the_padded_logprobs_loss_and_gradients(
    head_on_targets, monkeypatch, micro_batch_sequences
):
    batch = grouped_batch()
    calls = []
    real = train.packed_hidden
    monkeypatch.setattr(train, "packed_hidden", lambda *a: calls.append(1) or real(*a))
    logp, metrics, grads = _update(batch, True, micro_batch_sequences)
    assert calls  # the packed layout was used
    ref_logp, ref_metrics, ref_grads = _update(batch, False, micro_batch_sequences)
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=0)
    assert (logp[~batch.loss_mask] == 0).all() and (logp[batch.loss_mask] < 0).all()
    assert metrics["loss"] == pytest.approx(ref_metrics["loss"], abs=1e-6)
    assert metrics["entropy"] == pytest.approx(ref_metrics["entropy"], abs=1e-5)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], atol=1e-5, rtol=1e-4)
