"""The Algorithm object: built from the config, owns extra rollouts, the group filter,
batch preparation (advantages, reference and proximal forwards) and the loss."""

from __future__ import annotations

import pickle

import pytest
import torch

from streamrl.algorithms import (
    Filtered,
    PolicyGradient,
    ReMax,
    UnknownNameError,
    register_algorithm,
)
from streamrl.config import load_config
from streamrl.core.messages import GroupDone, GroupRejected, StartItems, VersionReport
from streamrl.core.timing import StageTimer
from streamrl.core.types import Item, Trajectory
from streamrl.engines.train.engine import TrainEngine
from streamrl.models import load_model_and_tokenizer
from streamrl.run.launch import train
from streamrl.stream.sample_stream import Group
from tests.tiny_run import algorithm_of


def traj(reward: float, item: int, prompt: int = 2, gen: int = 3) -> Trajectory:
    n = prompt + gen
    return Trajectory(
        input_ids=torch.arange(1, n + 1),
        loss_mask=torch.tensor([False] * prompt + [True] * gen),
        behavior_logprobs=torch.where(torch.arange(n) >= prompt, -1.0, 0.0),
        versions=torch.tensor([-1] * prompt + [0] * gen),
        reward=reward,
        item_index=item,
    )


def test_built_from_the_config_and_unknown_names_fail_early() -> None:
    assert type(algorithm_of(load_config())) is PolicyGradient
    remax = algorithm_of(load_config(None, ["algorithm.name=remax"]))
    assert isinstance(remax, ReMax) and [x.name for x in remax.extra_rollouts] == ["baseline"]
    with pytest.raises(
        UnknownNameError, match="unknown algorithm 'grpoo'; known: appo, bc, .*grpo"
    ):
        algorithm_of(load_config(None, ["algorithm.name=grpoo"]))
    with pytest.raises(KeyError, match="unknown policy loss"):
        algorithm_of(load_config(None, ["algorithm.policy_loss=ppo"]))


def test_group_relative_advantage_needs_two_samples_per_item() -> None:
    for name in ("grpo", "dr_grpo", "rloo"):
        with pytest.raises(ValueError, match="rollout.group_size=1 gives every sample"):
            algorithm_of(load_config(None, [f"algorithm.name={name}", "rollout.group_size=1"]))
    algorithm_of(load_config(None, ["algorithm.name=reinforce_pp", "rollout.group_size=1"]))


def test_dynamic_sampling_is_the_algorithms_group_filter() -> None:
    algo = algorithm_of(load_config())
    same = [traj(1.0, 0), traj(1.0, 0)]
    assert algo.finish_group(same, {}) == Filtered("zero_reward_std")
    mixed = [traj(1.0, 0), traj(0.0, 0)]
    assert algo.finish_group(mixed, {}) is mixed
    off = algorithm_of(load_config(None, ["algorithm.dynamic_sampling=false"]))
    assert off.finish_group(same, {}) is same


def _trainer() -> tuple[TrainEngine, object]:
    model, tokenizer = load_model_and_tokenizer("tiny-small", seed=0)
    return TrainEngine(model, micro_batch_sequences=4), tokenizer


def test_prepare_broadcasts_advantages_and_runs_only_the_forwards_it_needs() -> None:
    trainer, tokenizer = _trainer()
    groups = [Group(0, 0, [traj(1.0, 0), traj(0.0, 0)]), Group(1, 0, [traj(0.0, 1, gen=2)] * 2)]
    algo = algorithm_of(load_config(None, ["algorithm.dynamic_sampling=false"]))
    algo.setup(trainer, tokenizer)
    timer = StageTimer()
    batch = algo.prepare(groups, trainer, timer)
    # GRPO: group 0 -> +-1/sqrt(2) on its 3 generated tokens; group 1 has zero variance
    a = 2**-0.5
    torch.testing.assert_close(
        batch.advantages[0], torch.tensor([0, 0, a, a, a]), atol=1e-4, rtol=0
    )
    torch.testing.assert_close(
        batch.advantages[1], torch.tensor([0, 0, -a, -a, -a]), atol=1e-4, rtol=0
    )
    assert batch.advantages[2:].abs().sum() == 0
    assert batch.ref_logprobs is None and batch.proximal_logprobs is None
    assert set(timer.seconds) == {"time/advantage"}  # one optimizer step: no proximal pass

    cfg = load_config(None, ["algorithm.kl.coef=0.1", "train.num_minibatches=2"])
    algo = algorithm_of(cfg)
    algo.setup(trainer, tokenizer)
    timer = StageTimer()
    batch = algo.prepare(groups, trainer, timer)
    assert batch.ref_logprobs is not None and batch.proximal_logprobs is not None
    assert {"time/ref_logprob", "time/logprob"} <= set(timer.seconds)
    # the frozen reference starts equal to the policy, and stays frozen
    torch.testing.assert_close(batch.ref_logprobs, batch.proximal_logprobs)
    assert not any(p.requires_grad for p in algo.reference.parameters())
    state = algo.state_dict()
    fresh = algorithm_of(cfg)
    fresh.setup(trainer, tokenizer)
    fresh.load_state_dict(state)
    assert all(
        torch.equal(v, fresh.reference.state_dict()[k]) for k, v in state["reference"].items()
    )


def test_remax_uses_its_greedy_rollout_as_the_baseline() -> None:
    trainer, tokenizer = _trainer()
    algo = algorithm_of(load_config(None, ["algorithm.name=remax"]))
    algo.setup(trainer, tokenizer)
    samples = [traj(1.0, 0), traj(0.0, 0)]
    kept = algo.finish_group(samples, {"baseline": traj(1.0, 0)})
    batch = algo.prepare([Group(0, 0, kept)], trainer, StageTimer())
    assert batch.advantages[:, -1].tolist() == [0.0, -1.0]


def test_messages_are_frozen_and_pickle_unchanged() -> None:
    msgs = [
        StartItems((Item(id="q", prompt="1+1=", answer="2", index=3),)),
        VersionReport(2, {"tokens_generated": 5}),
        GroupDone(3, (traj(1.0, 3),), 1.0, 1, {"turns": 2.0}),
        GroupRejected(4, "filtered", "zero_reward_std", "", 2.0, 2),
    ]
    for m in msgs:
        back = pickle.loads(pickle.dumps(m))
        assert type(back) is type(m)
    with pytest.raises(AttributeError):
        msgs[1].version = 5  # type: ignore[misc]


@register_algorithm("test_sign")
class SignOfReward(PolicyGradient):
    """A new algorithm in a few lines: advantage +1 above the group mean, -1 below."""

    def advantages(self, batch, trajectories):
        from streamrl.algorithms import group_stats

        mean, _, _ = group_stats(batch.rewards, batch.item_index)
        return torch.sign(batch.rewards - mean)


def test_a_registered_algorithm_runs_through_the_unchanged_controller(tiny_config) -> None:
    cfg = tiny_config(
        "algorithm.name=test_sign",
        "algorithm.dynamic_sampling=false",
        "rollout.group_size=2",
        "train.items_per_step=2",
        "train.steps=2",
    )
    result = train(cfg)
    assert result.summary["stream/consumed"] == 4
