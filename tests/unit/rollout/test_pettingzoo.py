"""PettingZoo environments on the Gymnasium side: the agents as columns, one segment per
agent into the stream, shared and per-agent policies, bad environments, and real runs
on MPE's simple_spread."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from streamrl.cli.main import main
from streamrl.config import load_config
from streamrl.config.options import OptionsError, validate_options
from streamrl.models.policies import PolicyOptions, build_policy, load_policy
from streamrl.rollout.episodes import Trajectories
from streamrl.rollout.episodes.gym import EnvFailure, GymEpisode
from streamrl.run.launch import train
from streamrl.sources import build_task_source

pytest.importorskip("pettingzoo")
RELAY = "tests.pz_harness:relay"
F, T = False, True


class FakeEngine:
    """Acts 0; V(obs) = 10 * obs[0]."""

    version = 4

    def act(self, obs, *, greedy=False):
        n = obs.shape[0]
        return {
            "actions": np.zeros(n, np.int64),
            "logprobs": np.full(n, -0.5),
            "values": 10 * obs[:, 0],
        }

    def values(self, obs):
        return 10 * np.asarray(obs)[:, 0]


def _play(t_len: int, **options) -> Trajectories:
    env_options = options.pop("env_options", {})
    src = build_task_source(
        "pettingzoo",
        env_id=RELAY,
        env_options=env_options,
        num_envs=2,
        segment_length=t_len,
        **options,
    )
    return asyncio.run(GymEpisode()(FakeEngine(), next(src.train_iter(0)), seed=0))


def test_observations_are_padded_and_end_in_the_agent_id():
    src = build_task_source("pettingzoo", env_id=RELAY, agent_id=True)
    assert src.agents == ["a", "b"] and src.observation_space.shape == (4,)  # 2 + one-hot 2
    assert src.policy_options() == {}
    per = build_task_source("pettingzoo", env_id=RELAY, policies="per_agent")
    assert per.agent_id and per.policy_options() == {"agents": 2}
    a, b = _play(1, agent_id=True).trajectories
    assert a.obs[0].tolist() == [[0, 0, 1, 0]] * 2  # a's one value, zero-padded, id a
    assert b.obs[0].tolist() == [[0, 10, 0, 1]] * 2
    plain = _play(1).trajectories[1]
    assert plain.obs[0].tolist() == [[0, 10]] * 2


def test_one_segment_per_agent_with_its_rewards_episodes_and_versions():
    out = _play(7)  # every agent truncated at step 3: same-step autoreset
    assert isinstance(out, Trajectories) and len(out.trajectories) == 2
    a, b = out.trajectories
    assert a.metadata["agent"] == "a" and b.metadata["agent"] == "b"
    assert a.rewards.shape == b.rewards.shape == (7, 2)  # (T, copies)
    assert a.rewards.unique().tolist() == [1.0] and b.rewards.unique().tolist() == [2.0]
    assert a.obs[:, 0, 0].tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert a.truncated[:, 0].tolist() == [F, F, T, F, F, T, F] and not a.terminated.any()
    # V(final observation) = 10 * 3 where the time limit cut the episode
    assert b.final_values[:, 1].tolist() == [0, 0, 30, 0, 0, 30, 0]
    assert a.versions.tolist() == b.versions.tolist() == [4] * 7 and a.min_version == 4
    assert a.episode_returns == [3.0] * 4 and b.episode_returns == [6.0] * 4
    assert a.episode_lengths == b.episode_lengths == [3] * 4
    assert a.last_obs[:, 0].tolist() == [1, 1] and b.last_values.tolist() == [10.0, 10.0]


def test_the_first_agent_to_end_truncates_the_others():
    a, b = _play(3, env_options={"end": 2}).trajectories  # a terminates at step 2
    assert a.terminated[:, 0].tolist() == [F, T, F] and not a.truncated.any()
    assert b.truncated[:, 0].tolist() == [F, T, F] and not b.terminated.any()
    assert a.final_values[1].tolist() == [0, 0]  # terminal: no bootstrap
    assert b.final_values[1].tolist() == [20, 20]  # b bootstraps from V([2, 12])
    assert b.obs[2, 0].tolist() == [0, 10]  # both reset in the same step


@pytest.mark.parametrize(
    "options, match",
    [
        ({"raise_at": 2}, "step raised RuntimeError: the simulator crashed"),
        ({"drop_at": 2}, "step raised ValueError: .* no observation for agent b"),
        ({"nan_at": 2}, "non-finite reward"),
    ],
)
def test_a_broken_environment_fails_its_segment(options: dict, match: str):
    with pytest.raises(EnvFailure, match=match):
        _play(4, env_options=options)


@pytest.mark.parametrize(
    "options, match",
    [
        (
            {"env_id": "no_such_module_zz"},
            "No module named 'no_such_module_zz'.*streamrl\\[envs\\]",
        ),
        ({"env_id": "json"}, "json has no parallel_env"),
        ({"env_id": RELAY, "env_options": {"speed": 3}}, "env_options.*speed"),
        ({"env_id": RELAY, "env_options": {"act_b": 3}}, "action spaces differ"),
        ({"env_id": RELAY, "policies": "both"}, "policies"),
    ],
)
def test_bad_options_are_one_clear_line(options: dict, match: str):
    with pytest.raises(OptionsError, match=match):
        build_task_source("pettingzoo", **options)


def test_unknown_kind_lists_pettingzoo():
    with pytest.raises(ValueError, match="known: .*openenv.*pettingzoo.*textarena.*verifiers"):
        build_task_source("pettingzo")


def test_per_agent_policy_routes_each_row_to_its_agents_network(tmp_path: Path):
    src = build_task_source("pettingzoo", env_id=RELAY, policies="per_agent")
    policy = build_policy("mlp", *src.spaces(), obs_norm=True, **src.policy_options())
    torch.manual_seed(0)
    x = torch.randn(6, 2)
    onehot = torch.eye(2)[torch.tensor([0, 1, 0, 1, 1, 0])]
    obs = torch.cat([x, onehot], dim=1)
    policy.update_obs_stats(obs * 3 + 1)
    out = policy(obs)
    features = policy.normalize(obs)
    assert features[:, 2:].tolist() == onehot.tolist()  # the id is not normalised away
    for i, k in enumerate([0, 1, 0, 1, 1, 0]):
        expect = policy.critic.nets[k](features[i, :2])
        assert out["values"][i].item() == pytest.approx(expect.item(), abs=1e-6)
    # agent b's loss moves only agent b's networks
    policy.zero_grad()
    policy(obs[onehot[:, 1] == 1])["values"].sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in policy.critic.nets[0].parameters())
    assert any(p.grad is not None and p.grad.any() for p in policy.critic.nets[1].parameters())
    policy.save_pretrained(tmp_path / "p")
    again = load_policy(tmp_path / "p")
    assert again.agents == 2 and torch.equal(again.act(obs, greedy=True)["values"], out["values"])
    with pytest.raises(OptionsError, match="model.options.agents"):  # not set by hand
        validate_options(PolicyOptions, {"agents": 2}, ("model", "options"))


def _run(tmp_path: Path, *extra: str):
    return load_config(
        "examples/pettingzoo.yaml",
        [
            "train.steps=4",
            "data.options.num_envs=2",
            "data.options.segment_length=25",
            "eval.every=0",
            "eval.heldout_size=2",
            "runtime.backend=local",
            f"run.output_dir={tmp_path}",
            "run.progress=false",
            "run.tensorboard=false",
            *extra,
        ],
    )


@pytest.mark.parametrize("policies", ["per_agent", pytest.param("shared", marks=pytest.mark.slow)])
def test_a_run_trains_every_agent_and_keeps_its_books(tmp_path: Path, policies: str):
    pytest.importorskip("mpe2")
    result = train(_run(tmp_path, f"data.options.policies={policies}"))
    s = result.summary
    assert s["stream/consumed"] == 4 and s["stream/failed"] == 0
    assert s["stream/issued"] == s["stream/consumed"] + s["stream/filtered"] + s["stream/failed"]
    rows = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "env_steps" in r]
    # one item: 2 copies x 2 agents x 25 steps, one segment per agent
    assert [r["env_steps"] for r in steps] == [100.0] * 4
    assert all(r["episodes"] == 4.0 for r in steps)  # each copy's episode, once per agent
    assert max(r["staleness/max"] for r in steps) <= 1
    saved = load_policy(result.run_dir / "model")
    assert saved.agents == (2 if policies == "per_agent" else 1)
    assert main(["eval", str(result.run_dir)]) == 0
    metrics = json.loads((result.run_dir / "eval.json").read_text())["metrics"]
    assert metrics["return_mean"] == pytest.approx(s["eval_return_after"])
