"""DPO: the preference losses against hand-computed values, the loss_fn's pairing, the
preference file's errors, and a short DPO stage that raises the chosen completions'
log-probability relative to the rejected ones."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from streamrl.algorithms.dpo import DPOLoss, get_preference_loss
from streamrl.algorithms.stages import StageInputs, build_dpo_stage, encode_logged, run_stage
from streamrl.config import load_config
from streamrl.core.types import Batch
from streamrl.engines.train.engine import TrainEngine
from streamrl.models import load_model
from streamrl.sources.base import DataError
from streamrl.sources.logged import load_preferences


def t(x):
    return torch.tensor(x, dtype=torch.float32)


def test_sigmoid_and_ipo_losses_by_hand():
    chosen, rejected = t([1.0, -0.5]), t([0.0, 0.5])  # margins +1, -1
    losses, m = get_preference_loss("sigmoid")(chosen, rejected, beta=0.5)
    # -log sigmoid(0.5 * 1) = log(1 + e^-0.5); -log sigmoid(-0.5) = log(1 + e^0.5)
    expected = [math.log(1 + math.exp(-0.5)), math.log(1 + math.exp(0.5))]
    torch.testing.assert_close(losses, t(expected))
    assert m["reward_accuracy"] == 0.5 and m["reward_margin"] == pytest.approx(0.0)
    assert m["reward_chosen"] == pytest.approx(0.5 * 0.25)  # beta * mean(1, -0.5)
    losses, _ = get_preference_loss("ipo")(chosen, rejected, beta=0.5)
    # (margin - 1 / (2 * 0.5))^2: (1 - 1)^2 = 0, (-1 - 1)^2 = 4
    torch.testing.assert_close(losses, t([0.0, 4.0]))


def _pair_batch(logprobs: list[list[float]], ref: list[list[float]], mask: list[list[int]]):
    n, length = len(logprobs), len(logprobs[0])
    batch = Batch(
        input_ids=torch.zeros(n, length, dtype=torch.long),
        attention_mask=torch.ones(n, length, dtype=torch.bool),
        loss_mask=torch.tensor(mask, dtype=torch.bool),
        behavior_logprobs=torch.zeros(n, length),
        versions=torch.full((n, length), -1),
        rewards=torch.zeros(n),
        item_index=torch.arange(n) // 2,  # rows 2k, 2k+1: pair k
        ref_logprobs=t(ref),
    )
    return batch, t(logprobs).requires_grad_(True)


def test_dpo_loss_fn_pairs_adjacent_rows_and_ignores_masked_positions():
    # pair 0: chosen log-ratio (-1 + 2) + (-1 + 1) = 1, rejected (-3 + 2) = -1 (its
    # second position is masked: 99 there must not count) -> margin 2
    # pair 1: chosen -0.5 - 0 = -0.5, rejected -0.5 - (-1) = 0.5 -> margin -1
    batch, logp = _pair_batch(
        [[-1.0, -1.0], [-3.0, 99.0], [-0.5, 0.0], [-0.5, 0.0]],
        [[-2.0, -1.0], [-2.0, 0.0], [0.0, 0.0], [-1.0, 0.0]],
        [[1, 1], [1, 0], [1, 0], [1, 0]],
    )
    loss_fn = DPOLoss("sigmoid", beta=1.0)
    loss, m = loss_fn({"logprobs": logp}, batch)
    s = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = (-math.log(s(2.0)) - math.log(s(-1.0))) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert loss_fn.loss_weight(batch) == 2 and m["reward_accuracy"] == 0.5
    loss.backward()
    # d/d chosen token = -(1 - s(beta * margin)) * beta / P; rejected: the opposite sign
    g0, g1 = -(1 - s(2.0)) / 2, -(1 - s(-1.0)) / 2
    torch.testing.assert_close(
        logp.grad, t([[g0, g0], [-g0, 0.0], [g1, 0.0], [-g1, 0.0]]), atol=1e-6, rtol=0
    )
    odd = Batch(**{**batch.__dict__, "item_index": torch.tensor([0, 1, 1, 2])})
    with pytest.raises(ValueError, match="even train.micro_batch_sequences"):
        loss_fn({"logprobs": logp}, odd)


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_preference_rows_errors_name_file_line_and_field(tmp_path: Path):
    good = {"prompt": "1+1=", "chosen": "2", "rejected": "3"}
    cases = [
        ({"prompt": "1+1=", "rejected": "3"}, "field 'chosen': missing"),
        ({"prompt": "1+1=", "chosen": 2, "rejected": "3"}, "field 'chosen': expected a string"),
        ({"prompt": "1+1=", "chosen": "2", "rejected": "2"}, "field 'rejected': identical"),
        ({"chosen": "2", "rejected": "3"}, "missing prompt"),
        ({"prompt": 5, "chosen": "2", "rejected": "3"}, "field 'prompt': expected a string"),
    ]
    for row, message in cases:
        path = _write(tmp_path / "prefs.jsonl", [good, row])
        with pytest.raises(DataError, match=rf"prefs.jsonl:2: .*{message}"):
            load_preferences(path)
    chat = {"messages": [{"role": "user", "content": "1+1?"}], "chosen": "2", "rejected": "3"}
    pairs = load_preferences(_write(tmp_path / "ok.jsonl", [good, chat]))
    assert [p.line for p in pairs] == [1, 2] and pairs[1].item.messages[0]["content"] == "1+1?"
    assert "chosen" not in pairs[0].item.metadata


def _sequence_logprob(engine: TrainEngine, batch: Batch) -> torch.Tensor:
    lp = engine.compute_logprobs(batch)
    return torch.where(batch.loss_mask, lp, 0.0).sum(-1)  # (N,)


def test_a_short_dpo_stage_raises_chosen_over_rejected(tmp_path: Path):
    rows = [
        {"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)}
        for a in range(4)
        for b in range(4)
    ]
    path = _write(tmp_path / "prefs.jsonl", rows)
    cfg = load_config(
        None, [f"dpo.path={path}", "dpo.steps=30", "dpo.pairs_per_step=8", "dpo.beta=0.5"]
    )
    model, tokenizer = load_model("tiny-small", seed=0)
    engine = TrainEngine(model, lr=1e-2, micro_batch_sequences=4)  # 2 pairs per micro-batch
    stage = build_dpo_stage(cfg.dpo, StageInputs(tokenizer, engine, cfg.seed, max_len=256))
    everything = Batch.collate(
        [
            encode_logged(tokenizer, p.item, text, max_len=None, source="", line=p.line, field="")
            for p in load_preferences(path)
            for text in (p.chosen, p.rejected)
        ]
    )  # rows 2k, 2k+1: pair k's chosen and rejected completion
    before = _sequence_logprob(engine, everything)
    metrics = []
    run_stage(
        engine, stage.batches, 30, stage.loss_fn, lambda s, m: metrics.append(m), 0, stage.prepare
    )
    after = _sequence_logprob(engine, everything)
    margin_before = (before[0::2] - before[1::2]).mean()
    margin_after = (after[0::2] - after[1::2]).mean()
    assert margin_after > margin_before + 1.0, (margin_before, margin_after)
    assert metrics[-1]["reward_accuracy"] > metrics[0]["reward_accuracy"]
    # the reference stayed the policy the stage started from
    ref = engine.compute_logprobs(everything, model=stage.reference)
    torch.testing.assert_close(torch.where(everything.loss_mask, ref, 0.0).sum(-1), before)
