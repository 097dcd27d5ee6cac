"""Environments in the same dataflow: segments (truncation vs termination, autoreset),
policies, bad environments, and runs whose return rises."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from streamrl.cli.main import main
from streamrl.config import load_config
from streamrl.core.timing import StageTimer
from streamrl.models.policies import build_policy, load_policy
from streamrl.rollout.episodes.gym import GymEpisode
from streamrl.run.launch import train
from streamrl.sources import build_task_source
from streamrl.stream.sample_stream import Group
from tests.tiny_run import algorithm_of


class Counter(gym.Env):
    """obs = [steps taken in this episode]; reward 1; terminates at ``end`` if set."""

    observation_space = gym.spaces.Box(-1e6, 1e6, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(
        self, end: int | None = None, fail_at: int | None = None, nan_at: int | None = None
    ):
        self.end, self.fail_at, self.nan_at, self.t = end, fail_at, nan_at, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        if self.fail_at is not None and self.t >= self.fail_at:
            raise RuntimeError("the simulator crashed")
        obs = np.array([np.nan if self.t == self.nan_at else float(self.t)], np.float32)
        return obs, 1.0, self.end is not None and self.t >= self.end, False, {}


gym.register("StreamrlCounter-v0", entry_point=Counter, max_episode_steps=3)  # truncates at 3
gym.register("StreamrlCounterEnd-v0", entry_point=Counter, kwargs={"end": 2}, max_episode_steps=50)


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


def _segment(env_id: str, t_len: int, **options):
    src = build_task_source("gym", env_id=env_id, num_envs=2, segment_length=t_len, **options)
    item = next(src.train_iter(0))
    return asyncio.run(GymEpisode()(FakeEngine(), item, seed=0))


def test_segments_bootstrap_truncation_from_the_final_observation():
    seg = _segment("StreamrlCounter-v0", 7)
    obs = seg.obs[:, 0, 0].tolist()
    assert obs == [0, 1, 2, 0, 1, 2, 0]  # same-step autoreset: step 2 ends, step 3 starts anew
    assert seg.truncated[:, 0].tolist() == [F, F, T, F, F, T, F] and not seg.terminated.any()
    # V(final observation) = 10 * 3 where the time limit cut the episode
    assert seg.final_values[:, 0].tolist() == [0, 0, 30, 0, 0, 30, 0]
    assert seg.last_values.tolist() == [10.0, 10.0] and seg.last_obs[:, 0].tolist() == [1, 1]
    assert seg.versions.tolist() == [4] * 7 and seg.min_version == 4
    assert seg.episode_returns == [3.0] * 4 and seg.episode_lengths == [3] * 4


F, T = False, True


def test_terminated_episodes_are_not_bootstrapped_in_gae():
    seg = _segment("StreamrlCounterEnd-v0", 4)
    assert seg.terminated[:, 0].tolist() == [F, T, F, T] and not seg.truncated.any()
    cfg = load_config(
        None,
        [
            "algorithm.name=ppo",
            "algorithm.ppo.gamma=0.5",
            "algorithm.ppo.gae_lambda=1.0",
            "algorithm.ppo.norm_advantages=false",
        ],
    )
    algo = algorithm_of(cfg)

    class Trainer:
        class model:  # noqa: N801 - a stand-in with the one method prepare calls
            @staticmethod
            def update_obs_stats(obs):
                pass

        global_step = 0

    batch = algo.prepare([Group(0, 0, [seg])], Trainer(), StageTimer())
    adv = batch.advantages.reshape(4, 2)[:, 0]
    # step 1 terminates: A_1 = r - V = 1 - 10; A_0 = 1 + .5 V(s_1) - V(s_0) + .5 A_1 = 1 + 5 - 0 - 4.5
    assert adv.tolist() == pytest.approx([1.5, -9.0, 1.5, -9.0])


def test_policies_for_discrete_and_continuous_actions_save_and_load(tmp_path: Path):
    for env_id in ("CartPole-v1", "Pendulum-v1"):
        env = gym.make(env_id)
        policy = build_policy("mlp", env.observation_space, env.action_space, obs_norm=True)
        obs = torch.randn(5, *env.observation_space.shape)
        policy.update_obs_stats(obs * 3 + 1)
        out = policy(obs)
        assert out["logprobs"].shape == out["values"].shape == out["entropy"].shape == (5,)
        policy.save_pretrained(tmp_path / env_id)
        again = load_policy(tmp_path / env_id)
        a = policy.act(obs, greedy=True)
        b = again.act(obs, greedy=True)
        assert torch.equal(a["actions"], b["actions"]) and torch.equal(a["values"], b["values"])
    with pytest.raises(ValueError, match="cnn needs \\(C, H, W\\) observations"):
        build_policy("cnn", gym.make("CartPole-v1").observation_space, env.action_space)


def test_bad_environments_give_clear_errors(tmp_path: Path, capsys):
    code = main(
        [
            "train",
            "model.name_or_path=mlp",
            "data.kind=gym",
            "data.options={env_id: NoSuchEnv-v9}",
            "rollout.episode=gym",
            "sft.steps=0",
            f"run.output_dir={tmp_path}",
        ]
    )
    assert code == 2 and "data.options.env_id='NoSuchEnv-v9'" in capsys.readouterr().err
    code = main(
        [
            "train",
            "model.name_or_path=mlp",
            "data.kind=gym",
            "data.options={env_id: CarRacing-v3}",
            "rollout.episode=gym",
            "sft.steps=0",
            f"run.output_dir={tmp_path}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and ("mlp needs flat observations" in err or "Box2D" in err or "box2d" in err)
    assert list(tmp_path.iterdir()) == []


def _quick(tmp_path: Path, env_id: str, *extra: str):
    return load_config(
        "examples/cartpole.yaml",
        [
            f"data.options={{env_id: {env_id}, num_envs: 2, segment_length: 8}}",
            "train.steps=4",
            "runtime.backend=local",  # envs registered here exist only in this process
            "eval.every=0",
            "eval.heldout_size=2",
            f"run.output_dir={tmp_path}",
            "run.progress=false",
            "run.tensorboard=false",
            *extra,
        ],
    )


@pytest.mark.parametrize("env_id", ["StreamrlCounterCrash-v0", "StreamrlCounterNaN-v0"])
def test_an_env_that_raises_or_returns_nan_is_a_counted_failure(tmp_path: Path, env_id: str):
    cfg = _quick(tmp_path, env_id, "rollout.max_consecutive_failures=3")
    with pytest.raises(Exception, match="items in a row failed.*(crashed|non-finite)"):
        train(cfg)
    (run_dir,) = list(tmp_path.iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"


gym.register(
    "StreamrlCounterCrash-v0", entry_point=Counter, kwargs={"fail_at": 2}, max_episode_steps=50
)
gym.register(
    "StreamrlCounterNaN-v0", entry_point=Counter, kwargs={"nan_at": 2}, max_episode_steps=50
)


@pytest.mark.slow  # trains until CartPole's return rises
@pytest.mark.parametrize("advantage", ["ppo", "appo"])
def test_cartpole_return_rises(tmp_path: Path, advantage: str):
    cfg = load_config(
        "examples/cartpole.yaml",
        [
            "train.steps=48",
            "eval.every=0",
            f"algorithm.name={advantage}",
            f"run.output_dir={tmp_path}",
            "run.progress=false",
            "run.tensorboard=false",
        ],
    )
    s = train(cfg).summary
    assert s["eval_return_after"] > max(100.0, 3 * s["eval_return_before"]), s
    assert s["stream/consumed"] == 48


def test_continuous_actions_run_through_the_pipeline(tmp_path: Path):
    cfg = load_config(
        "examples/pendulum.yaml",
        [
            "data.options={env_id: Pendulum-v1, num_envs: 2, segment_length: 64}",
            "train.steps=3",
            "train.num_minibatches=2",
            "eval.heldout_size=1",
            f"run.output_dir={tmp_path}",
            "run.progress=false",
            "run.tensorboard=false",
        ],
    )
    result = train(cfg)
    assert result.summary["stream/consumed"] == 3
    saved = load_policy(result.run_dir / "model")
    assert not saved.discrete and saved.act_dim == 1
    # `streamrl eval` on the run: the mean return of deterministic episodes
    assert main(["eval", str(result.run_dir)]) == 0
    metrics = json.loads((result.run_dir / "eval.json").read_text())["metrics"]
    assert metrics["return_mean"] == pytest.approx(result.summary["eval_return_after"])


def test_envpool_resets_in_the_same_step_and_trains(tmp_path: Path):
    """EnvPool resets on the next step; the adapter resets at once, as gymnasium does:
    the step that ends an episode returns the new episode's first observation and the
    final one in info["final_obs"]."""
    pytest.importorskip("envpool")
    from streamrl.sources.gym import make_vector_env

    envs = make_vector_env("CartPole-v1", 4, "envpool")
    first, _ = envs.reset(seed=5)
    again, _ = make_vector_env("CartPole-v1", 4, "envpool").reset(seed=5)
    np.testing.assert_array_equal(first, again)
    ended = 0
    for _ in range(60):  # always push left: every pole falls within a few dozen steps
        obs, reward, term, trunc, info = envs.step(np.zeros(4, dtype=np.int64))
        assert np.all(reward == 1.0)  # no reward-0 reset step in between
        for i in np.nonzero(term | trunc)[0]:
            ended += 1
            assert abs(info["final_obs"][i][2]) > 0.2  # the pole fell: |angle| > 12 degrees
            assert abs(obs[i][2]) < 0.05  # a fresh episode
    envs.close()
    assert ended >= 4
    cfg = load_config(
        "examples/cartpole.yaml",
        [
            "data.options={env_id: CartPole-v1, num_envs: 4, segment_length: 16, "
            "vectorization: envpool}",
            "train.steps=3",
            "runtime.backend=local",
            "eval.every=0",
            "eval.heldout_size=2",
            f"run.output_dir={tmp_path}",
            "run.progress=false",
            "run.tensorboard=false",
        ],
    )
    assert train(cfg).summary["stream/consumed"] == 3
