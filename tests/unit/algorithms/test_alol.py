"""A-LoL: the loss and the value baseline against hand-computed values, the logged
file's errors (NaN or non-numeric rewards, completions longer than the context), and a
short A-LoL stage that trains only on positive-advantage rows and raises their
log-probability."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from streamrl.algorithms import PolicyLossParams, get_policy_loss, make_rl_loss_fn
from streamrl.algorithms.alol import reference_value
from streamrl.algorithms.stages import StageInputs, build_alol_stage, encode_logged, run_stage
from streamrl.config import load_config
from streamrl.core.types import Batch, Item
from streamrl.engines.train.engine import TrainEngine
from streamrl.models import load_model
from streamrl.sources.base import DataError
from streamrl.sources.logged import load_completions


def t(x):
    return torch.tensor(x, dtype=torch.float32)


def test_alol_loss_by_hand():
    # row 0: log pi - log pi_ref = 0.5 + 0 -> ratio e^0.5 = 1.65, clipped to 1 + 0.2; A = 2
    # row 1: log ratio -0.3 -> 0.74, clipped to 0.8; A = -1 -> A+ = 0: no loss, no gradient
    logp = t([[-1.0, -2.0], [-0.5, 7.0]]).requires_grad_(True)  # 7.0: masked, ignored
    ref = t([[-1.5, -2.0], [-0.2, 0.0]])
    mask = torch.tensor([[True, True], [True, False]])
    adv = t([[2.0, 2.0], [-1.0, 0.0]])
    params = PolicyLossParams(
        clip_low=0.2, clip_high=0.2, agg_mode="seq_mean_token_sum_norm", max_tokens=2
    )
    loss, m = get_policy_loss("alol")(logp, ref, adv, mask, params=params)
    # -(1/2 seqs) * [1.2 * 2 * (-1 - 2) / 2 tokens + 0] = 1.8
    assert loss.item() == pytest.approx(1.8, abs=1e-6)
    assert m["clip_frac"] == 1.0
    assert m["seq_ratio_mean"] == pytest.approx((math.exp(0.5) + math.exp(-0.3)) / 2, abs=1e-5)
    loss.backward()
    # d loss / d log pi of row 0's tokens = -1.2 * 2 / 2 / 2 = -0.6; row 1: 0
    torch.testing.assert_close(logp.grad, t([[-0.6, -0.6], [0.0, 0.0]]))

    # an unclipped weight is used as it is, and is not a gradient path
    logp2 = t([[-1.0, -2.0]]).requires_grad_(True)
    loss2, _ = get_policy_loss("alol")(
        logp2, t([[-1.1, -2.0]]), t([[1.0, 1.0]]), mask[:1], params=params
    )
    w = math.exp(0.1)  # inside [0.8, 1.2]
    assert loss2.item() == pytest.approx(w * 3 / 2, abs=1e-6)
    loss2.backward()
    torch.testing.assert_close(logp2.grad, t([[-w / 2, -w / 2]]))

    with pytest.raises(ValueError, match="decoupled=false"):
        get_policy_loss("alol")(logp, ref, adv, mask, proximal_logprobs=ref, params=params)


def test_alol_composes_like_grpo_losses():
    """RLLoss pins A-LoL's sequence aggregation, so micro-batches weigh by sequences."""
    fn = make_rl_loss_fn("alol", PolicyLossParams(max_tokens=4))
    assert fn.params.agg_mode == "seq_mean_token_sum_norm"
    tokenizer = load_model("tiny-small")[1]
    batch = Batch.collate(
        [
            encode_logged(
                tokenizer, Item(id=p, prompt=p), c, max_len=None, source="", line=1, field=""
            )
            for p, c in (("1+1=", "2"), ("2+2=", "44"))
        ]
    )
    assert fn.loss_weight(batch) == 2  # sequences, not tokens


def test_reference_value_by_hand():
    rewards, prompts = t([1.0, 0.0, 0.5, 1.0, 0.0]), torch.tensor([0, 0, 1, 1, 2])
    # prompt 0: (1 + 0) / 2; prompt 1: (0.5 + 1) / 2; prompt 2 has one row -> the global
    # mean (1 + 0 + 0.5 + 1 + 0) / 5 = 0.5
    torch.testing.assert_close(
        reference_value(rewards, prompts, "prompt_mean"), t([0.5, 0.5, 0.75, 0.75, 0.5])
    )
    torch.testing.assert_close(reference_value(rewards, prompts, "global_mean"), t([0.5] * 5))
    with pytest.raises(ValueError, match="prompt_mean"):
        reference_value(rewards, prompts, "learned")


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_logged_rows_errors_name_file_line_and_field(tmp_path: Path):
    good = '{"prompt": "1+1=", "completion": "2", "reward": 1}'
    cases = [
        (
            '{"prompt": "1+1=", "completion": "2", "reward": NaN}',
            "field 'reward': expected a finite number, got nan",
        ),
        (
            '{"prompt": "1+1=", "completion": "2", "reward": Infinity}',
            "field 'reward': expected a finite number",
        ),
        (
            '{"prompt": "1+1=", "completion": "2", "reward": "high"}',
            "field 'reward': expected a number, got str",
        ),
        (
            '{"prompt": "1+1=", "completion": "2", "reward": true}',
            "field 'reward': expected a number, got bool",
        ),
        ('{"prompt": "1+1=", "completion": "2"}', "field 'reward': missing"),
        ('{"prompt": "1+1=", "reward": 1}', "field 'completion': missing"),
        (
            '{"prompt": "1+1=", "completion": ["2"], "reward": 1}',
            "field 'completion': expected a string, got list",
        ),
    ]
    for row, message in cases:
        path = _write(tmp_path / "log.jsonl", [good, "", row])  # line 2 is blank
        with pytest.raises(DataError, match=rf"log.jsonl:3: {message}"):
            load_completions(path)
    rows = load_completions(_write(tmp_path / "ok.jsonl", [good, good.replace("1}", "0.5}")]))
    assert [r.reward for r in rows] == [1.0, 0.5] and rows[1].line == 2


def test_a_completion_longer_than_the_context_is_an_error_naming_it(tmp_path: Path):
    path = _write(
        tmp_path / "log.jsonl",
        [
            {"prompt": "1+1=", "completion": "2", "reward": 1},
            {"prompt": "1+1=", "completion": "9" * 300, "reward": 0},
        ],
    )
    cfg = load_config(None, [f"alol.path={path}", "alol.steps=1"])
    model, tokenizer = load_model("tiny-small")
    with pytest.raises(
        DataError,
        match=r"log.jsonl:2: field 'completion': prompt \+ completion is 306 tokens, longer "
        r"than the model's context of 256 tokens",
    ):
        build_alol_stage(
            cfg.alol, StageInputs(tokenizer, TrainEngine(model), cfg.seed, max_len=256)
        )


def test_no_positive_advantage_is_an_error(tmp_path: Path):
    rows = [{"prompt": f"{a}+1=", "completion": "0", "reward": 0.0} for a in range(3)]
    cfg = load_config(None, [f"alol.path={_write(tmp_path / 'log.jsonl', rows)}"])
    model, tokenizer = load_model("tiny-small")
    with pytest.raises(ValueError, match="no logged completion has a reward above its baseline"):
        build_alol_stage(
            cfg.alol, StageInputs(tokenizer, TrainEngine(model), cfg.seed, max_len=256)
        )


def test_a_short_alol_stage_trains_on_positive_advantages_only(tmp_path: Path):
    # every prompt: its right answer (reward 1) and two wrong ones (reward 0); the
    # per-prompt baseline is 1/3, so only the right answers have a positive advantage
    rows = []
    for a in range(4):
        for b in range(4):
            rows += [
                {"prompt": f"{a}+{b}=", "completion": str(a + b), "reward": 1.0},
                {"prompt": f"{a}+{b}=", "completion": str(a + b + 1), "reward": 0.0},
                {"prompt": f"{a}+{b}=", "completion": str(a + b + 2), "reward": 0.0},
            ]
    path = _write(tmp_path / "log.jsonl", rows)
    cfg = load_config(None, [f"alol.path={path}", "alol.steps=30", "alol.examples_per_step=8"])
    model, tokenizer = load_model("tiny-small", seed=0)
    engine = TrainEngine(model, lr=1e-2)
    stage = build_alol_stage(cfg.alol, StageInputs(tokenizer, engine, cfg.seed, max_len=256))
    assert stage.summary == pytest.approx(
        {"rows": 48, "prompts": 16, "positive_rows": 16, "reward_mean": 1 / 3}
    )
    logged = load_completions(path)
    everything = Batch.collate(
        [
            encode_logged(
                tokenizer, r.item, r.completion, max_len=None, source="", line=0, field=""
            )
            for r in logged
        ]
    )
    rewards = torch.tensor([r.reward for r in logged])

    def mean_logprob(reward: float) -> float:
        lp = torch.where(everything.loss_mask, engine.compute_logprobs(everything), 0.0).sum(-1)
        return float(lp[rewards == reward].mean())

    right_before, wrong_before = mean_logprob(1.0), mean_logprob(0.0)
    seen = []

    def prepare(batch: Batch) -> Batch:
        seen.append(batch.rewards.clone())
        return stage.prepare(batch)

    run_stage(engine, stage.batches, 30, stage.loss_fn, lambda s, m: None, 0, prepare)
    assert torch.cat(seen).eq(1.0).all()  # never a zero-reward (negative-advantage) row
    right_after, wrong_after = mean_logprob(1.0), mean_logprob(0.0)
    assert right_after > right_before + 1.0, (right_before, right_after)
    assert right_after - wrong_after > right_before - wrong_before + 1.0
