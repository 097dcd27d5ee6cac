"""Offline RL for environments: Minari datasets (made locally), the offline losses
against hand-computed values, the algorithms' plumbing (target networks, delayed actor
updates), bad datasets, and an offline run whose return rises above a random policy's."""

from __future__ import annotations

import doctest
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from streamrl.algorithms import offline_losses as L
from streamrl.cli.main import main
from streamrl.core import transitions
from streamrl.core.timing import StageTimer
from streamrl.core.transitions import Transitions, segment_transitions
from streamrl.core.types import Segment
from streamrl.engines.factory import make_train_engine
from streamrl.models.policies import build_policy
from streamrl.models.q_networks import TwinQ, polyak_update
from streamrl.run.launch import train
from streamrl.sources import DataError, build_task_source, minari_make
from streamrl.sources.minari_make import PolicySpec, make_minari, play_episode
from streamrl.stream.sample_stream import Group
from tests.tiny_run import algorithm_of


@pytest.fixture(autouse=True)
def _datasets(tmp_path, monkeypatch):
    """Every test makes its datasets in its own MINARI_DATASETS_PATH."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))


@pytest.mark.parametrize("module", [L, transitions, minari_make])
def test_doctests(module: object) -> None:
    assert doctest.testmod(module).failed == 0


# ---------------------------------------------------------------- losses, by hand


def test_bc_loss_is_the_mean_negative_log_likelihood():
    lp = torch.log(torch.tensor([0.5, 0.25]))
    assert float(L.bc_loss(lp)) == pytest.approx((math.log(2) + math.log(4)) / 2)
    assert L.get_offline_loss("bc") is L.bc_loss


def test_expectile_loss_weights_positive_residuals_by_tau():
    q = torch.tensor([3.0, 0.0], requires_grad=True)
    v = torch.tensor([1.0, 1.0], requires_grad=True)
    loss = L.expectile_loss(q, v, 0.7)  # u = [2, -1]: (0.7 * 4 + 0.3 * 1) / 2
    assert loss.item() == pytest.approx(1.55)
    loss.backward()
    assert v.grad.tolist() == pytest.approx([-1.4, 0.3])  # d/dv w u^2 / 2 = -w u
    assert q.grad is None  # Q is the target


def test_iql_q_loss_bootstraps_from_v_unless_terminated():
    q1, q2 = torch.tensor([1.0, 2.0]), torch.tensor([0.0, 2.0])
    loss = L.iql_q_loss(
        q1,
        q2,
        torch.tensor([1.0, 0.0]),
        torch.tensor([2.0, 4.0]),
        torch.tensor([False, True]),
        gamma=0.5,
    )
    # y = [1 + 0.5 * 2, 0]; q1: (1 + 4) / 2 = 2.5; q2: (4 + 4) / 2 = 4
    assert loss.item() == pytest.approx(0.5 * (2.5 + 4.0))


def test_awr_weights_are_exp_beta_advantage_capped():
    lp = torch.tensor([-1.0, -2.0], requires_grad=True)
    adv = torch.tensor([0.0, math.log(2)])
    loss = L.awr_loss(lp, adv, beta=1.0, max_weight=100.0)  # weights [1, 2]
    assert loss.item() == pytest.approx(-(1 * -1 + 2 * -2) / 2)
    loss.backward()
    assert lp.grad.tolist() == pytest.approx([-0.5, -1.0])
    capped = L.awr_loss(lp, adv, beta=1.0, max_weight=1.5)  # weights [1, 1.5]
    assert capped.item() == pytest.approx(-(1 * -1 + 1.5 * -2) / 2)


def test_awr_weight_stats_mean_cap_share_and_effective_sample_size():
    adv = torch.tensor([0.0, math.log(2), 10.0])  # weights [1, 2, 100 (capped)]
    s = L.awr_weight_stats(adv, beta=1.0, max_weight=100.0)
    assert s["awr_weight_mean"] == pytest.approx(103 / 3)
    assert s["awr_weight_capped"] == pytest.approx(1 / 3)
    assert s["awr_ess"] == pytest.approx(103**2 / (3 * (1 + 4 + 100**2)))  # 0.3535
    assert L.awr_weight_stats(torch.zeros(4), beta=3.0, max_weight=100.0)["awr_ess"] == 1.0


def test_td3_target_takes_the_smaller_q_and_stops_at_termination():
    y = L.td3_target(
        torch.tensor([1.0, 1.0]),
        torch.tensor([False, True]),
        torch.tensor([3.0, 5.0]),
        torch.tensor([4.0, 2.0]),
        gamma=0.9,
    )
    assert y.tolist() == pytest.approx([1 + 0.9 * 3, 1.0])


def test_td3_critic_loss_sums_both_critics():
    loss = L.td3_critic_loss(
        torch.tensor([1.0, 2.0]), torch.tensor([2.0, 2.0]), torch.tensor([1.0, 0.0])
    )
    assert loss.item() == pytest.approx((0 + 4) / 2 + (1 + 4) / 2)


def test_td3_bc_actor_loss_normalises_q_by_its_mean_magnitude():
    q_pi = torch.tensor([2.0, -4.0], requires_grad=True)
    pi = torch.tensor([[0.5], [0.0]], requires_grad=True)
    a = torch.tensor([[0.0], [1.0]])
    loss = L.td3_bc_actor_loss(q_pi, pi, a, alpha=2.5)
    lam = 2.5 / 3.0  # alpha / mean |Q|
    assert loss.item() == pytest.approx(-lam * -1.0 + (0.25 + 1.0) / 2)
    loss.backward()
    assert q_pi.grad.tolist() == pytest.approx([-lam / 2, -lam / 2])  # lambda held constant
    assert pi.grad.flatten().tolist() == pytest.approx([0.5, -1.0])  # 2 (pi - a) / 2


def test_smoothed_actions_clip_the_noise_and_the_box():
    mean = torch.zeros(2000, 1)
    low, high = torch.tensor([-2.0]), torch.tensor([2.0])
    g = torch.Generator().manual_seed(0)
    a = L.smoothed_actions(mean, low, high, noise=10.0, noise_clip=0.5, generator=g)
    assert a.abs().max() == pytest.approx(1.0)  # noise_clip 0.5 x half-width 2
    same = L.smoothed_actions(torch.full((3, 1), 5.0), low, high, noise=0.0, noise_clip=0.5)
    assert same.flatten().tolist() == [2.0, 2.0, 2.0]


def test_polyak_update_moves_the_target_by_tau():
    src, tgt = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    for p in src.parameters():
        torch.nn.init.constant_(p, 1.0)
    for p in tgt.parameters():
        torch.nn.init.constant_(p, 0.0)
    polyak_update(tgt, src, 0.1)
    assert [float(p) for p in tgt.parameters()] == pytest.approx([0.1, 0.1])


# ---------------------------------------------------------------- transitions


def test_segment_transitions_drop_truncated_steps_and_keep_versions():
    obs = torch.arange(8.0).reshape(2, 2, 2)  # T=2, N=2
    seg = Segment(
        obs=obs,
        actions=torch.tensor([[0, 1], [1, 0]]),
        logprobs=torch.zeros(2, 2),
        values=torch.zeros(2, 2),
        rewards=torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
        terminated=torch.tensor([[False, True], [False, False]]),
        truncated=torch.tensor([[False, False], [True, False]]),
        final_values=torch.zeros(2, 2),
        last_obs=torch.tensor([[8.0, 9.0], [10.0, 11.0]]),
        last_values=torch.zeros(2),
        versions=torch.tensor([3, 4]),
    )
    tr = segment_transitions(seg)
    assert tr.rewards.tolist() == [1.0, 2.0, 4.0]  # (t=1, env 0) was truncated
    assert tr.next_obs.tolist() == [[4.0, 5.0], [6.0, 7.0], [10.0, 11.0]]
    assert tr.terminated.tolist() == [False, True, False]
    assert tr.versions.tolist() == [3, 3, 4] and not tr.logged and tr.min_version == 3


# ---------------------------------------------------------------- Minari datasets


class Heuristic:
    """CartPole: push towards where the pole falls (~200-500 return); ``eps`` random."""

    def __init__(self, eps: float = 0.0, seed: int = 0) -> None:
        self.eps, self.rng = eps, np.random.default_rng(seed)

    def act(self, obs: torch.Tensor, greedy: bool = False) -> dict[str, torch.Tensor]:
        o = obs[0]
        a = int(float(o[2]) + 0.5 * float(o[3]) > 0)
        if self.rng.random() < self.eps:
            a = int(self.rng.integers(2))
        return {"actions": torch.tensor([a])}


def _dataset(dataset_id: str, buffers: list, env_id: str = "CartPole-v1") -> None:
    import minari

    with warnings.catch_warnings():  # Minari asks for an author, a permalink, ...
        warnings.simplefilter("ignore", UserWarning)
        minari.create_dataset_from_buffers(dataset_id, buffers, env=env_id, data_format="arrow")


def _heuristic_dataset(dataset_id: str, episodes: int, eps: float) -> None:
    from streamrl.sources.gym import make_env

    env = make_env("CartPole-v1")
    policy = Heuristic(eps)
    _dataset(dataset_id, [play_episode(env, policy, 1000 + k, False, k) for k in range(episodes)])


def test_make_minari_random_and_load_it_as_a_task_source():
    assert (
        main(["data", "make-minari", "CartPole-v1", "--policy", "random", "--episodes", "4"]) == 0
    )
    src = build_task_source("minari", dataset_id="cartpole/random-v0", batch_transitions=8)
    import minari

    ds = minari.load_dataset("cartpole/random-v0")
    assert src.data.size == ds.total_steps and src.stats["episodes"] == 4
    ep = next(iter(ds.iterate_episodes()))
    t = len(ep.rewards)  # the first episode's transitions come first
    assert torch.equal(src.data.next_obs[:t], torch.as_tensor(ep.observations[1:]))
    assert src.data.terminated[:t].tolist() == list(ep.terminations)
    item = next(src.train_iter(0))
    tr = item.metadata["transitions"]
    assert isinstance(tr, Transitions) and tr.size == 8 and tr.logged and tr.num_generated == 0
    assert src.heldout(2)[0].metadata["env_id"] == "CartPole-v1"
    assert src.phases == {}  # offline only


def test_make_minari_mix_of_a_saved_policy_and_random(tmp_path):
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    build_policy("mlp", env.observation_space, env.action_space).save_pretrained(tmp_path / "p")
    _, summary = make_minari(
        "CartPole-v1",
        minari_make.parse_mix([f"{tmp_path / 'p'}:2", "random:1"]),
        3,
        dataset_id="cartpole/mixed-v0",
    )
    assert summary["episodes"] == 3 and set(summary["return_mean_by_policy"]) == {
        str(tmp_path / "p"),
        "random",
    }
    with pytest.raises(FileExistsError, match="--overwrite"):
        make_minari("CartPole-v1", [PolicySpec("random")], 1, dataset_id="cartpole/mixed-v0")
    pend = gym.make("Pendulum-v1")
    build_policy("mlp", pend.observation_space, pend.action_space).save_pretrained(tmp_path / "q")
    with pytest.raises(ValueError, match="does not match CartPole-v1"):
        make_minari("CartPole-v1", [PolicySpec(str(tmp_path / "q"))], 1, dataset_id="xx/yy-v0")


def test_a_missing_dataset_names_the_path_and_the_command(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        build_task_source("minari", dataset_id="cartpole/nothing-v0")
    msg = str(e.value)
    assert "MINARI_DATASETS_PATH=" + str(tmp_path / "minari") in msg
    assert "streamrl data make-minari" in msg and "cartpole/nothing-v0" in msg


def test_dataset_spaces_must_match_the_environment():
    _heuristic_dataset("cartpole/h-v0", 1, 0.0)
    with pytest.raises(DataError) as e:
        build_task_source("minari", dataset_id="cartpole/h-v0", env_id="Acrobot-v1")
    msg = str(e.value)
    assert e.value.field == "observation_space" and e.value.line is not None
    assert msg.startswith(str(Path(e.value.source))) and "metadata.json:" in msg
    assert "Acrobot-v1" in msg


def _buffer(k: int, rewards: list[float], n_obs: int | None = None):
    from minari.data_collector.episode_buffer import EpisodeBuffer

    t = len(rewards)
    n_obs = t + 1 if n_obs is None else n_obs
    return EpisodeBuffer(
        id=k,
        seed=k,
        observations=np.zeros((n_obs, 4), np.float32),
        actions=np.zeros(t, np.int64),
        rewards=rewards,
        terminations=[False] * t,
        truncations=[False] * (t - 1) + [True] if t else [],
        infos={},
    )


def test_nan_rewards_name_the_episode_step_and_field():
    _dataset("cartpole/nan-v0", [_buffer(0, [1.0, 1.0]), _buffer(1, [1.0, 1.0, float("nan")])])
    with pytest.raises(DataError) as e:
        build_task_source("minari", dataset_id="cartpole/nan-v0")
    assert e.value.field == "rewards" and e.value.row == 2
    assert e.value.source.endswith("nan-v0/data/1")
    assert "nan-v0/data/1: row 2: field 'rewards': not finite" in str(e.value)


def test_empty_episodes_are_an_error():
    _dataset("cartpole/empty-v0", [_buffer(0, [1.0]), _buffer(1, [], n_obs=1)])
    with pytest.raises(DataError, match=r"empty-v0/data/1: field 'rewards': empty episode"):
        build_task_source("minari", dataset_id="cartpole/empty-v0")


def test_offline_to_online_items_interleave_at_the_configured_ratio():
    _heuristic_dataset("cartpole/h-v0", 2, 0.0)
    src = build_task_source(
        "minari", dataset_id="cartpole/h-v0", offline_fraction=0.5, offline_items=2
    )
    kinds = ["transitions" in it.metadata for it in _take(src.train_iter(0), 7)]
    assert kinds == [True, True, False, True, False, True, False]
    assert src.phases == {"offline": 2}
    with pytest.raises(ValueError, match="offline_fraction"):
        build_task_source("minari", dataset_id="cartpole/h-v0", offline_fraction=1.5)


def _take(it, n):
    return [next(it) for _ in range(n)]


# ---------------------------------------------------------------- algorithms


def _offline(advantage: str, dataset: str) -> list[str]:
    """An offline control run: the MLP policy on a Minari dataset, one item per step;
    the final weights saved (the runs below evaluate or compare them)."""
    return [
        "model.name_or_path=mlp",
        "data.kind=minari",
        f"data.options={{dataset_id: {dataset}, batch_transitions: 32}}",
        "rollout.episode=gym",
        "rollout.group_size=1",
        f"algorithm.name={advantage}",
        "algorithm.offline.q_hidden=[16, 16]",
        "train.items_per_step=1",
        "eval.heldout_size=2",
        "run.save_weights=true",
    ]


def _pendulum_dataset() -> str:
    assert (
        main(["data", "make-minari", "Pendulum-v1", "--policy", "random", "--episodes", "1"]) == 0
    )
    return "pendulum/random-v0"


def _one_batch(cfg, trainer):
    src = build_task_source(cfg.data.kind, **cfg.data.options)
    item = next(src.train_iter(0))
    return [Group(0, 0, [item.metadata["transitions"]])]


def _engine(cfg):
    src = build_task_source(cfg.data.kind, **cfg.data.options)
    policy = build_policy("mlp", src.observation_space, src.action_space)
    return make_train_engine(policy, seed=0, max_grad_norm=100.0)


@pytest.mark.parametrize("kind", ["cartpole", "pendulum"])
def test_iql_trains_q_v_and_policy_and_moves_its_target(tiny_config, kind):
    if kind == "cartpole":
        _heuristic_dataset("cartpole/h-v0", 1, 0.1)
        dataset = "cartpole/h-v0"
    else:
        dataset = _pendulum_dataset()
    cfg = tiny_config(*_offline("iql", dataset), "algorithm.offline.target_tau=0.5")
    algo, trainer = algorithm_of(cfg), _engine(cfg)
    algo.setup(trainer, None)
    trainer.reset_optimizer(1e-3)
    q, target = algo.loss_fn.q, algo.loss_fn.target_q
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    q_before = [p.clone() for p in q.parameters()]
    t_before = [p.clone() for p in target.parameters()]
    batch = algo.prepare(_one_batch(cfg, trainer), trainer, StageTimer())
    m = trainer.train_batch(batch, algo.loss_fn)
    assert {"value_loss", "q_loss", "policy_loss"} <= set(m) and m["steps"] == 1
    after = trainer.model.state_dict()
    for name in ("actor.0.weight", "critic.0.weight"):  # the policy and V moved
        assert not torch.equal(before[name], after[name])
    assert all(not torch.equal(a, b) for a, b in zip(q_before, q.parameters(), strict=True))
    for t0, t1, qp in zip(t_before, target.parameters(), q.parameters(), strict=True):
        assert torch.allclose(t1, 0.5 * t0 + 0.5 * qp)  # Polyak with tau 0.5
    assert "target_q" in algo.state_dict()


def test_iql_scales_the_rewards_of_its_td_target(tiny_config):
    cfg = tiny_config(*_offline("iql", _pendulum_dataset()), "algorithm.offline.reward_scale=0.25")
    algo, trainer = algorithm_of(cfg), _engine(cfg)
    algo.setup(trainer, None)
    batch = algo.prepare(_one_batch(cfg, trainer), trainer, StageTimer())
    loss_fn, policy = algo.loss_fn, trainer.model
    with torch.no_grad():
        _, m = loss_fn(policy(batch.obs, batch.actions), batch)
        q1, q2 = loss_fn.q(policy.normalize(batch.obs), batch.actions)
        next_v = policy.critic(policy.normalize(batch.next_obs)).squeeze(-1)
        y = 0.25 * batch.rewards + 0.99 * (~batch.terminated).float() * next_v
        by_hand = 0.5 * ((q1 - y).square().mean() + (q2 - y).square().mean())
    assert batch.rewards.abs().min() > 0  # Pendulum's rewards: the scale shows
    assert m["q_loss"] == pytest.approx(float(by_hand), rel=1e-5)
    assert 0 < m["awr_ess"] <= 1


def test_td3_bc_delays_the_actor_and_its_targets(tiny_config):
    cfg = tiny_config(*_offline("td3_bc", _pendulum_dataset()), "algorithm.offline.policy_delay=2")
    algo, trainer = algorithm_of(cfg), _engine(cfg)
    algo.setup(trainer, None)
    trainer.reset_optimizer(1e-3)
    loss = algo.loss_fn
    actor0 = [p.clone() for p in trainer.model.actor.parameters()]
    target0 = [p.clone() for p in loss.target_actor.parameters()]
    batch = algo.prepare(_one_batch(cfg, trainer), trainer, StageTimer())
    m1 = trainer.train_batch(batch, loss)  # critic only
    assert "actor_loss" not in m1 and loss.updates == 1
    assert all(
        torch.equal(a, b) for a, b in zip(actor0, trainer.model.actor.parameters(), strict=True)
    )
    assert all(
        torch.equal(a, b) for a, b in zip(target0, loss.target_actor.parameters(), strict=True)
    )
    m2 = trainer.train_batch(batch, loss)  # critic and actor, then the targets
    assert "actor_loss" in m2 and loss.updates == 2
    assert not torch.equal(actor0[0], trainer.model.actor[0].weight)
    assert not torch.equal(target0[0], loss.target_actor[0].weight)
    state = algo.state_dict()
    assert state["updates"] == 2 and {"target_q", "target_actor", "generator"} <= set(state)


def test_td3_bc_refuses_discrete_actions_and_offline_algorithms_need_one_sample(tiny_config):
    _heuristic_dataset("cartpole/h-v0", 1, 0.0)
    cfg = tiny_config(*_offline("td3_bc", "cartpole/h-v0"))
    with pytest.raises(ValueError, match="continuous"):
        algorithm_of(cfg).setup(_engine(cfg), None)
    with pytest.raises(ValueError, match="group_size must be 1"):
        algorithm_of(tiny_config(*_offline("iql", "cartpole/h-v0"), "rollout.group_size=2"))


def test_twin_q_shapes():
    d = TwinQ(4, 3, True, [8])
    q1, q2 = d(torch.zeros(5, 4), torch.tensor([0, 1, 2, 0, 1]))
    assert q1.shape == q2.shape == (5,)
    c = TwinQ(3, 1, False, [8])
    assert c(torch.zeros(5, 3), torch.zeros(5, 1))[0].shape == (5,)


# ---------------------------------------------------------------- runs


@pytest.mark.parametrize("advantage", ["bc", "iql"])
def test_offline_cartpole_return_rises_above_random(tiny_config, advantage):
    """A medium dataset (a heuristic with 20% random actions); the policy trained offline
    through the stream beats the random policy's return (~22) by far."""
    _heuristic_dataset("cartpole/medium-v0", 15, 0.2)
    cfg = tiny_config(
        *_offline(advantage, "cartpole/medium-v0"),
        "data.options={dataset_id: cartpole/medium-v0, batch_transitions: 256}",
        "train.steps=300",
        "train.lr=1e-3",
        "train.max_grad_norm=100",
        "eval.heldout_size=5",
        "run.checkpoint_every=0",
        "algorithm.offline.gamma=0.99",
    )
    summary = train(cfg).summary
    assert summary["eval_return_after"] > 100 > summary["eval_return_before"] + 50
    rows = [json.loads(x) for x in (Path(summary["run_dir"]) / "metrics.jsonl").open()]
    assert rows[-1]["offline/fraction"] == 1.0 and rows[-1]["stream/consumed"] == 300
    assert main(["eval", summary["run_dir"]]) == 0  # the saved policy evaluates


def test_offline_to_online_reports_both_phases(tiny_config):
    _heuristic_dataset("cartpole/medium-v0", 5, 0.2)
    cfg = tiny_config(
        *_offline("iql", "cartpole/medium-v0"),
        "data.options={dataset_id: cartpole/medium-v0, batch_transitions: 64, "
        "offline_fraction: 0.5, offline_items: 6, num_envs: 2, segment_length: 32}",
        "train.steps=10",
        "run.checkpoint_every=0",
    )
    summary = train(cfg).summary
    assert {"eval_return_before", "eval_return_after_offline", "eval_return_after"} <= set(summary)
    rows = [json.loads(x) for x in (Path(summary["run_dir"]) / "metrics.jsonl").open()]
    assert "eval/return" in next(r for r in rows if r["step"] == 6)
    assert all(r["offline/fraction"] == 1.0 for r in rows if 1 <= r["step"] <= 6)
    assert any(r.get("env_steps", 0) > 0 for r in rows if r["step"] > 6)  # online segments


def test_train_with_a_missing_dataset_is_a_one_line_error(tmp_path, capsys):
    code = main(
        [
            "train",
            "model.name_or_path=mlp",
            "data.kind=minari",
            "data.options={dataset_id: cartpole/absent-v0}",
            "rollout.episode=gym",
            "rollout.group_size=1",
            "algorithm.name=bc",
            "sft.steps=0",
            f"run.output_dir={tmp_path / 'runs'}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: data.options.dataset_id='cartpole/absent-v0'")
    assert "MINARI_DATASETS_PATH" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("advantage", ["iql", "td3_bc"])
def test_resume_from_a_checkpoint_is_bit_exact(tmp_path, tiny_config, advantage):
    """Q-networks (trainer extras), targets, the delay counter and the smoothing noise
    are checkpointed: continuing from step 4 ends with the uninterrupted run's weights."""
    import shutil

    from safetensors.torch import load_file

    from streamrl.run.launch import resume_config

    dataset = _pendulum_dataset()
    cfg = tiny_config(
        *_offline(advantage, dataset),
        "train.steps=8",
        "run.checkpoint_every=4",
        "run.keep_checkpoints=5",
        "stream.max_staleness=0",
        output_dir=tmp_path / "a",
    )
    full = Path(train(cfg).summary["run_dir"])
    part = tmp_path / "b"
    shutil.copytree(full, part)
    shutil.rmtree(part / "model")  # as if killed after step 4: no final state, no summary
    shutil.rmtree(part / "checkpoints" / "done-000008")
    (part / "summary.json").unlink()
    (part / "checkpoints" / "latest").write_text("rl-000004")
    train(resume_config(part, []), resume_dir=part)
    resumed = f"resuming from checkpoint {part / 'checkpoints' / 'rl-000004'}"
    assert resumed in (part / "run.log").read_text()
    a, b = (
        load_file(full / "model" / "model.safetensors"),
        load_file(part / "model" / "model.safetensors"),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
