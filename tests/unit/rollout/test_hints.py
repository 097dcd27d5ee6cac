"""Hints for all-wrong prompts (``selection.kind: hints``): a hint appears only after an
all-wrong group, shortens as the prompt's hinted groups succeed, lengthens when they fail,
goes away at zero; an item without a reference is counted, never hinted; the forced
prefix is masked from the loss (zero gradient, hand-computed loss); the hinted flag
reaches the step metrics; the schedule survives a checkpoint."""

from __future__ import annotations

import asyncio
import itertools
import math

import pytest
import torch

from streamrl.algorithms.losses import RLLoss
from streamrl.config import load_config
from streamrl.config.hints import HintsConfig
from streamrl.core.messages import GroupDone
from streamrl.core.types import HINT_KEY, Batch, GenerationResult, Item, SamplingParams
from streamrl.rollout.episodes.single_turn import SingleTurnEpisode, trajectory_from_result
from streamrl.rollout.rewards import CompositeReward
from streamrl.rollout.selection import Source, build_sampler
from streamrl.rollout.selection.hint_solutions import (
    arithmetic_solution,
    reference_solution,
    render_hint,
)
from streamrl.rollout.selection.hints import hint_metrics

G = 4


class Chars:
    """One token per character (ids = code points)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


def sampler(start: int = 0, **hints):
    """The pool side of a hints sampler over prompts q<start>, q<start+1>, ..."""
    cfg = load_config(None, ["selection.kind=hints", "rollout.group_size=4"])
    cfg.selection.hints = HintsConfig(**hints)
    s = build_sampler(cfg.selection, cfg.rollout, 0)
    items = (Item(id=f"q{i}", prompt=f"{i}+1=", answer=str(i + 1)) for i in itertools.count(start))
    s.attach(Source(lambda: next(items)))
    return s


def play(s, wins, index: int) -> Item:
    """Issue item ``index``, report ``wins(item)`` successes of G, publish: the item."""
    item = s.issue(index)
    item.index = index
    n = wins(item) if callable(wins) else wins
    s.finished(item, GroupDone(index, (), 0.0, G, rewards=(1.0,) * n + (0.0,) * (G - n)))
    s.published(index + 1, outstanding=set())
    return item


def fraction(item: Item) -> float | None:
    return item.metadata[HINT_KEY]["fraction"] if HINT_KEY in item.metadata else None


def policy(item: Item) -> int:
    """q1 is solved only with a hint (4/4 with half the solution, 2/4 with a quarter), q2
    never, every other prompt half the time."""
    if item.id == "q1":
        return {None: 0, 0.5: 4, 0.25: 2}[fraction(item)]
    return 0 if item.id == "q2" else 2


def test_a_hint_comes_only_after_an_all_wrong_group_and_shortens_as_success_rises() -> None:
    s = sampler(initial_fraction=0.5, step=0.25, max_fraction=0.75, revisit_share=0.5)
    seen: dict[str, list[float | None]] = {}
    for i in range(24):
        item = play(s, policy, i)
        seen.setdefault(item.id, []).append(fraction(item))
    # q1: hinted after its all-wrong group, shorter with each success, gone at 0; its
    # next unhinted group is all wrong again, so the hint comes back
    assert seen["q1"][:5] == [None, 0.5, 0.25, None, 0.5]
    assert seen["q2"][:4] == [None, 0.5, 0.75, 0.75]  # longer while all wrong, capped
    assert all(f is None for k, v in seen.items() if k not in ("q1", "q2") for f in v)
    m = s.metrics()
    assert m["hints/graduated"] >= 1 and m["hints/lengthened"] >= 1
    assert m["hints/revisits"] <= 0.5 * m["hints/issued"]  # the revisit share holds
    assert m["hints/hinted"] == sum(f is not None for v in seen.values() for f in v)


def test_a_prompt_without_a_reference_is_counted_once_said_and_never_hinted(caplog) -> None:
    s = sampler()
    items = (Item(id=f"n{i}", prompt="?") for i in range(2))
    s.attach(Source(lambda: next(items)))
    with caplog.at_level("WARNING"):
        assert all(fraction(play(s, 0, i)) is None for i in range(2))
    assert s.metrics()["hints/no_reference"] == 2 and s.metrics()["hints/revisits"] == 0
    assert sum("no reference solution" in r.message for r in caplog.records) == 1


def test_the_schedule_continues_from_a_checkpoint_exactly() -> None:
    a = sampler()
    for i in range(7):
        play(a, policy, i)
    b = sampler(start=int(a.metrics()["hints/issued"] - a.metrics()["hints/revisits"]))
    b.load_state_dict(a.state_dict(outstanding=set()))
    assert b.metrics() == a.metrics()
    after = [
        [(lambda it: (it.id, fraction(it)))(play(x, policy, i)) for i in range(7, 19)]
        for x in (a, b)
    ]
    assert after[0] == after[1] and any(f is not None for _, f in after[0])


@pytest.mark.parametrize(
    "operands, operators, expected",
    [
        ([3, 4], ["+"], "3+4=7"),
        ([9, 4, 2], ["-", "*"], "4*2=8, 9-8=1"),
        ([2, 3, 4, 5], ["*", "+", "*"], "2*3=6, 4*5=20, 6+20=26"),
        ([7], [], "7"),
    ],
)
def test_arithmetic_worked_solutions_end_in_the_answer(operands, operators, expected) -> None:
    assert arithmetic_solution(operands, operators) == expected


def test_the_reference_is_a_worked_solution_first_then_the_answer() -> None:
    worked = Item(id="a", prompt="?", answer="5", metadata={"solution": "2+3=5"})
    assert reference_solution(worked) == "2+3=5"
    arith = Item(id="b", prompt="?", answer="5", metadata={"operands": [2, 3], "operators": ["+"]})
    assert reference_solution(arith) == "2+3=5"
    assert reference_solution(Item(id="c", prompt="?", answer="cat")) == "cat"
    assert reference_solution(Item(id="d", prompt="?", answer="")) is None


def _hinted(item: Item, mode: str, frac: float) -> Item:
    hint = {"fraction": frac, "mode": mode, "solution": "<answer>1234</answer>"}
    return render_hint(
        Item(item.id, item.prompt, item.messages, item.answer, metadata={HINT_KEY: hint}),
        Chars(),
        "{prompt} Hint: {hint}",
    )


def test_a_hint_is_cut_to_its_fraction_in_the_completion_or_in_the_prompt() -> None:
    plain = Item(id="p", prompt="Q?")
    pre = _hinted(plain, "prefix", 0.5)
    # ceil(0.5 * 21 tokens) = 11
    assert pre.metadata[HINT_KEY]["text"] == "<answer>123" and pre.prompt == "Q?"
    assert pre.metadata[HINT_KEY]["prefix_ids"] == [ord(c) for c in "<answer>123"]
    chat = Item(id="c", messages=[{"role": "user", "content": "Q?"}])
    shown = _hinted(chat, "prompt", 0.1)
    assert shown.messages[-1]["content"] == "Q? Hint: <an"  # ceil(0.1 * 21) = 3 tokens
    assert chat.messages[-1]["content"] == "Q?" and "prefix_ids" not in shown.metadata[HINT_KEY]
    assert _hinted(plain, "prompt", 0.01).metadata[HINT_KEY]["tokens"] == 1  # at least one


class Echo:
    """An engine that answers every prompt with the same tokens, log-prob -1 each."""

    def __init__(self, answer: str) -> None:
        self.answer, self.requests = [ord(c) for c in answer], []

    async def agenerate(self, request):
        self.requests.append(request)
        n = len(self.answer)
        return GenerationResult(request.prompt_ids, self.answer, [-1.0] * n, [3] * n, "stop")


def test_forced_hint_tokens_are_masked_and_get_no_gradient() -> None:
    item = _hinted(Item(id="p", prompt="Q?", answer="1234"), "prefix", 0.5)
    scorer = CompositeReward([("numeric_match", 1.0)])  # the last number of hint + answer
    engine = Echo("4</answer>")
    episode = SingleTurnEpisode(Chars(), SamplingParams(), scorer)
    episode.prompt_ids = lambda it: [ord(c) for c in it.prompt]  # (no chat template)
    t = asyncio.run(episode(engine, item, seed=0))
    hint_len = len("<answer>123")
    assert engine.requests[0].prompt_ids == [ord(c) for c in "Q?<answer>123"]
    assert t.metadata["completion"] == "<answer>1234</answer>" and t.reward == 1.0
    assert t.metadata["hint_tokens"] == hint_len
    n_prompt, n_gen = 2 + hint_len, len("4</answer>")
    assert t.loss_mask.tolist() == [False] * n_prompt + [True] * n_gen
    assert t.behavior_logprobs[:n_prompt].eq(0).all() and t.versions[:n_prompt].eq(-1).all()
    # the RL loss on the hinted sample, CISPO: -sg[r] * A * logp per token, token mean,
    # r = exp(logp - behaviour logp) = exp(-0.5 + 1) on every generated token
    batch = Batch.collate([t])
    batch.advantages = torch.where(batch.loss_mask, 2.0, 5.0)  # garbage where masked
    logprobs = torch.full(batch.loss_mask.shape, -0.5, requires_grad=True)
    loss, _ = RLLoss("cispo")({"logprobs": logprobs}, batch)
    r = math.exp(0.5)
    assert loss.item() == pytest.approx(-r * 2.0 * -0.5)  # the mean over n_gen tokens only
    loss.backward()
    assert logprobs.grad[0, :n_prompt].eq(0).all()
    assert torch.allclose(logprobs.grad[0, n_prompt:], torch.full((n_gen,), -r * 2.0 / n_gen))


def test_the_hinted_flag_reaches_the_metrics_split_by_hinted_and_not() -> None:
    def sample(reward: float, hinted: bool, adv: float):
        meta = {HINT_KEY: {"fraction": 0.5, "tokens": 3}} if hinted else {}
        res = GenerationResult([1, 2], [3, 4], [-1.0, -1.0], [0, 0], "stop")
        return trajectory_from_result(res, reward, 0, meta), adv

    rows = [sample(1.0, True, 1.5), sample(0.0, True, -0.5), sample(0.0, False, -1.0)]
    samples = [s for s, _ in rows]
    adv = torch.tensor([[0.0, 0.0, a, a] for _, a in rows])
    m = hint_metrics(samples, adv)
    assert m["hints/hinted_share"] == pytest.approx(2 / 3)
    assert m["hints/reward_hinted"] == 0.5 and m["hints/reward_plain"] == 0.0
    assert m["hints/adv_hinted"] == 0.5 and m["hints/adv_abs_hinted"] == 1.0
    assert m["hints/adv_plain"] == -1.0 and m["hints/hint_tokens_mean"] == 3
    assert hint_metrics(samples[2:], adv[2:]) == {}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["selection.kind=posterior", "selection.hints.mode=prompt"], "needs selection.kind=hints"),
        (["selection.kind=hints", "rollout.episode=agent"], "only rollout.episode=single_turn"),
    ],
)
def test_preflight_refuses_hint_options_that_cannot_work(overrides, message) -> None:
    from streamrl.rollout.selection import check_sampler
    from streamrl.run.assembly import sampler_context

    with pytest.raises(ValueError, match=message):
        check_sampler(sampler_context(load_config(None, overrides)))
    check_sampler(sampler_context(load_config(None, [*overrides[:1], "selection.kind=hints"])))
