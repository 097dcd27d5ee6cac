"""SFT interleaved with RL (``algorithm.interleaved_sft``): the loss is the RL loss on the
RL rows plus weight * NLL on the demonstration rows (hand-computed, with its gradient, and
exact under micro-batch accumulation); the share of demonstration rows holds over steps;
the prompts failed most come first; a hinted success is a demonstration with its hint
trained; the buffer and its random generator continue exactly from a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from streamrl.algorithms.interleaved_sft import InterleavedSFT, append_rows, prompt_key, rl_rows
from streamrl.algorithms.losses import RLLoss
from streamrl.config import load_config
from streamrl.core.messages import DroppedGroup
from streamrl.core.timing import StageTimer
from streamrl.core.types import HINT_KEY, Batch, Trajectory
from streamrl.engines.train.engine import slice_batch
from streamrl.stream.sample_stream import Group
from tests.tiny_run import algorithm_of


def _traj(prompt: list[int], answer: list[int], reward: float, **meta) -> Trajectory:
    n_p = len(prompt)
    return Trajectory(
        input_ids=torch.tensor(prompt + answer),
        loss_mask=torch.tensor([False] * n_p + [True] * len(answer)),
        behavior_logprobs=torch.tensor([0.0] * n_p + [-1.0] * len(answer)),
        versions=torch.tensor([-1] * n_p + [0] * len(answer)),
        reward=reward,
        metadata=meta,
    )


def _algo(*overrides: str) -> InterleavedSFT:
    cfg = load_config(None, ["algorithm.interleaved_sft.share=0.25", *overrides])
    algo = algorithm_of(cfg)
    assert isinstance(algo, InterleavedSFT)
    return algo


def test_off_by_default_and_refused_where_the_loss_is_not_a_policy_gradient() -> None:
    assert not isinstance(algorithm_of(load_config(None, [])), InterleavedSFT)
    with pytest.raises(ValueError, match="interleaved_sft needs a policy-gradient"):
        _algo("algorithm.name=ppo")


def _mixed_batch() -> Batch:
    rl = Batch.collate([_traj([1, 2], [3, 4, 5], 1.0), _traj([1, 2], [6], 0.0)])
    rl.advantages = torch.tensor([[0.0, 0.0, 1.0, 1.0, 1.0], [0.0, 0.0, -2.0, 0.0, 0.0]])
    demos = Batch.collate([_traj([7], [8, 9, 10, 11, 12], 0.0)])
    return append_rows(rl, demos, pad=0)


def test_the_loss_is_rl_plus_weight_times_nll_on_demonstrations_hand_computed() -> None:
    batch = _mixed_batch()
    assert batch.demonstration.tolist() == [False, False, True]
    assert batch.input_ids.shape == (3, 6) and batch.advantages[2].eq(0).all()
    w = 0.5
    loss_fn = _algo(f"algorithm.interleaved_sft.weight={w}", "algorithm.policy_loss=cispo").loss_fn
    assert isinstance(loss_fn.inner, RLLoss)
    logprobs = torch.full((3, 6), -1.0, requires_grad=True)  # ratio 1 on every RL token
    loss, metrics = loss_fn({"logprobs": logprobs, "entropy": torch.zeros(3, 6)}, batch)
    # RL tokens: CISPO's -A * logp = A (4 tokens: 1, 1, 1, -2); demonstration tokens: w * 1
    # (5 tokens); the token mean of the 9
    assert loss.item() == pytest.approx((1 + 1 + 1 - 2 + w * 5) / 9)
    assert metrics["sft/nll"] == pytest.approx(1.0) and loss_fn.loss_weight(batch) == 9
    loss.backward()
    grad = logprobs.grad
    assert torch.allclose(grad[0, 2:5], torch.full((3,), -1 / 9))  # -A / 9
    assert grad[1, 2].item() == pytest.approx(2 / 9) and grad[1, 3:].eq(0).all()
    assert torch.allclose(grad[2, 1:6], torch.full((5,), -w / 9))  # -w / 9 per NLL token
    assert grad[:2, :2].eq(0).all() and grad[2, 0] == 0  # prompts: nothing


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_micro_batches_accumulate_to_the_one_piece_loss(agg: str) -> None:
    """The engine scales micro-batch k's loss by its units over the minibatch's."""
    batch = _mixed_batch()
    loss_fn = _algo(f"algorithm.agg_mode={agg}", "algorithm.policy_loss=cispo").loss_fn
    lp = torch.linspace(-2.0, -0.1, 18).reshape(3, 6)
    whole, _ = loss_fn({"logprobs": lp}, batch)
    total = loss_fn.loss_weight(batch)
    parts = 0.0
    for rows in (slice(0, 1), slice(1, 3)):
        mb = slice_batch(batch, rows)
        parts += loss_fn({"logprobs": lp[rows]}, mb)[0].item() * loss_fn.loss_weight(mb) / total
    assert parts == pytest.approx(whole.item())


def _groups(step: int, wins: dict[int, int]) -> list[Group]:
    """One group of 4 per prompt p (tokens [p, p]); ``wins[p]`` of them succeed."""
    out = []
    for p, n in wins.items():
        answers = [_traj([p, p], [step, 100 + k], float(k < n)) for k in range(4)]
        out.append(Group(p, 0, answers))
    return out


def test_the_share_holds_and_the_prompts_failed_most_come_first() -> None:
    algo = _algo("algorithm.interleaved_sft.share=0.25", "algorithm.dynamic_sampling=false")
    rows = demo_rows = 0
    for step in range(12):
        # prompt p succeeds p times out of 4 (p = 1..3); prompt 9 always (plenty of demos)
        batch = algo.prepare(_groups(step, {1: 1, 2: 2, 3: 3, 9: 4}), None, StageTimer())
        n_demo = int(batch.demonstration.sum()) if batch.demonstration is not None else 0
        if step:
            demo_prompts = [int(batch.input_ids[i, 0]) for i in range(16, batch.size)]
            # the prompts with the lowest success rate first: 1/4, 2/4, 3/4, 4/4
            assert demo_prompts == [1, 2, 3, 9][:n_demo]
        rows, demo_rows = rows + batch.size, demo_rows + n_demo
        assert len(rl_rows(batch).rewards) == 16
    # 16 RL rows a step: 16 / 3 = 5.33 demonstrations wanted, 4 prompts in the buffer
    assert demo_rows == 4 * 11


def test_the_share_is_exact_over_steps_when_demonstrations_abound() -> None:
    algo = _algo("algorithm.interleaved_sft.share=0.2", "algorithm.dynamic_sampling=false")
    rows = demo_rows = 0
    for step in range(10):
        wins = {p: 1 for p in range(10 * step + 1, 10 * step + 11)}  # 10 fresh prompts
        batch = algo.prepare(_groups(step, wins), None, StageTimer())
        n_demo = int(batch.demonstration.sum()) if batch.demonstration is not None else 0
        rows, demo_rows = rows + batch.size, demo_rows + n_demo
        if step:
            assert abs(demo_rows / rows - 0.2) < 1 / rows + 0.2 * 40 / rows  # step 0: none
    # 40 RL rows a step want 10 each; the first step had an empty buffer
    assert demo_rows == 90


def test_a_hinted_success_is_a_demonstration_with_its_hint_tokens_trained() -> None:
    algo = _algo("algorithm.interleaved_sft.share=0.5")
    hinted = _traj([5, 5, 40, 41], [42, 43], 1.0, hint_tokens=2, **{HINT_KEY: {"tokens": 2}})
    plain = _traj([5, 5], [9, 9], 0.0)
    algo.prepare([Group(0, 0, [hinted, plain])], None, StageTimer())
    batch = algo.prepare([Group(1, 0, [plain, plain])], None, StageTimer())
    demo = batch.loss_mask[batch.demonstration][0]
    assert batch.input_ids[batch.demonstration][0].tolist() == [5, 5, 40, 41, 42, 43]
    assert demo.tolist() == [False, False, True, True, True, True]


def test_the_buffer_continues_exactly_from_a_checkpoint() -> None:
    a = _algo("algorithm.interleaved_sft.share=0.3", "algorithm.dynamic_sampling=false")
    for step in range(3):
        a.prepare(_groups(step, {p: 1 + (p + step) % 3 for p in range(1, 8)}), None, StageTimer())
    b = _algo("algorithm.interleaved_sft.share=0.3", "algorithm.dynamic_sampling=false")
    state = a.state_dict()
    b.load_state_dict(torch.load(_saved(state), weights_only=False))
    for step in range(3, 6):
        groups = _groups(step, {p: 1 + (p * step) % 4 for p in range(1, 8)})
        x, y = (algo.prepare(groups, None, StageTimer()) for algo in (a, b))
        assert torch.equal(x.input_ids, y.input_ids) and torch.equal(x.loss_mask, y.loss_mask)


def _saved(state: dict) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp()) / "algorithm.pt"
    torch.save(state, path)
    return path


def test_demonstrations_from_a_file(tmp_path: Path, monkeypatch) -> None:
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(3)]
    path = tmp_path / "demos.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    algo = _algo("algorithm.interleaved_sft.source=file", f"algorithm.interleaved_sft.path={path}")

    class Chars:
        pad_token_id, eos_token_id, chat_template = 0, 1, None

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [ord(c) for c in text]

    monkeypatch.setattr(
        "streamrl.algorithms.stages.base.encode_prompt", lambda tok, it: tok.encode(it.prompt)
    )
    monkeypatch.setattr(
        "streamrl.algorithms.stages.base.reference_ids", lambda tok, text: tok.encode(text) + [1]
    )
    algo.buffer.load_file(Chars(), str(path))
    batch = algo.prepare(_groups(0, {1: 0, 2: 0, 3: 0}), None, StageTimer())
    demos = batch.input_ids[batch.demonstration]
    # 12 RL rows want 4 at a share of 0.25; the file's 3 prompts, each once a batch
    texts = ["".join(chr(c) for c in row.tolist() if c > 1) for row in demos]
    assert sorted(texts) == ["0+1=1", "1+1=2", "2+1=3"]
    again = algo.prepare(_groups(1, {1: 0, 2: 0, 3: 0}), None, StageTimer())
    assert int(again.demonstration.sum()) == 3  # reused


def _dropped(index: int, prompt: list[int], wins: int, answer: str | None) -> DroppedGroup:
    answers = [_traj(prompt, [50 + k], float(k < wins)) for k in range(4)]
    return DroppedGroup(index, answers, answer)


def _char_ids(monkeypatch) -> None:
    """Reference answers tokenized as their characters' codes, then EOS (1)."""
    monkeypatch.setattr(
        "streamrl.algorithms.interleaved_sft.reference_ids",
        lambda tok, text: [ord(c) for c in text] + [1],
    )


def test_an_all_wrong_group_gives_its_reference_answer_as_a_demonstration(monkeypatch) -> None:
    _char_ids(monkeypatch)
    algo = _algo(
        "algorithm.interleaved_sft.source=reference",
        'algorithm.interleaved_sft.solution_format="{<{solution}>}"',  # braces kept
        "algorithm.interleaved_sft.share=0.5",
    )
    assert algo.wants_dropped
    # a hinted sample (prefix mode): the forced hint tokens are not part of the prompt
    hinted = _traj([7, 7, 60], [61], 0.0, hint_tokens=1, **{HINT_KEY: {"tokens": 1}})
    algo.observe_dropped(
        [
            _dropped(3, [5, 5], 0, "12"),  # all wrong: a demonstration
            _dropped(4, [6, 6], 4, "9"),  # all right: none
            _dropped(5, [8, 8], 0, None),  # all wrong, no reference: counted
            DroppedGroup(6, [hinted, hinted], "x"),
        ]
    )
    assert algo.buffer.no_reference == 1 and len(algo.buffer.demos) == 2
    batch = algo.prepare(_groups(0, {1: 1}), None, StageTimer())
    assert int(batch.demonstration.sum()) == 2 and not batch.demonstration[:4].any()
    got = {}
    for ids, mask in zip(batch.input_ids[4:], batch.loss_mask[4:], strict=True):
        n = int((ids != 0).sum())  # right-padded with 0; the tokens here are never 0
        got[tuple(ids[:n].tolist())] = mask[:n].tolist()
    assert got == {
        (5, 5, *(ord(c) for c in "{<12>}"), 1): [False] * 2 + [True] * 7,
        (7, 7, *(ord(c) for c in "{<x>}"), 1): [False] * 2 + [True] * 6,
    }
    # each used once: the next batch has no demonstrations left
    again = algo.prepare(_groups(1, {1: 1}), None, StageTimer())
    assert again.demonstration is None or not bool(again.demonstration.any())


@pytest.mark.parametrize("source", ["successes", "reference"])
def test_the_rates_count_the_dropped_groups(source: str, monkeypatch) -> None:
    """Prompt 2 wins 2 of 4 in its consumed group but its three dropped groups were all
    wrong (2/16): it ranks before prompt 1 (1/4); prompt 3's dropped all-right groups
    (3/4 consumed, 8/8 dropped) rank it after prompt 1."""
    _char_ids(monkeypatch)
    algo = _algo(
        f"algorithm.interleaved_sft.source={source}",
        "algorithm.dynamic_sampling=false",
        "algorithm.interleaved_sft.share=0.5",
    )
    algo.prepare(_groups(0, {1: 1, 2: 2, 3: 3}), None, StageTimer())
    if source == "reference":  # references for the three prompts, whatever their rate
        for p in (1, 2, 3):
            algo.buffer.keep(prompt_key(torch.tensor([p, p]), 2), *_demo_row(p))
    wrong = [_dropped(10 + k, [2, 2], 0, "a") for k in range(3)]
    right = [_dropped(20 + k, [3, 3], 4, "b") for k in range(2)]
    algo.observe_dropped(wrong + right)
    assert algo.buffer.rates[prompt_key(torch.tensor([2, 2]), 2)] == [2, 16]
    assert algo.buffer.rates[prompt_key(torch.tensor([3, 3]), 2)] == [11, 12]
    batch = algo.prepare(_groups(1, {9: 2}), None, StageTimer())
    firsts = [int(r[0]) for r in batch.input_ids[batch.demonstration]]
    assert firsts[:3] == [2, 1, 3]


def _demo_row(p: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([p, p, 70, 1]), torch.tensor([False, False, True, True])


def test_solution_format_must_place_the_solution() -> None:
    for bad in ("<{answer}>", "no placeholder", "<answer></answer>"):
        with pytest.raises(ValueError, match="solution_format must contain") as err:
            load_config(None, [f"algorithm.interleaved_sft.solution_format={bad}"])
        assert "algorithm.interleaved_sft.solution_format" in str(err.value)
        assert "\n" not in str(err.value)
