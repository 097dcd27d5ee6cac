"""run/assembly.py: the whole config cut into what each component takes."""

from __future__ import annotations

import json
import pickle

import pytest

from streamrl.config import RunContext, load_config
from streamrl.engines.factory import engine_options
from streamrl.rollout.episodes import EpisodeSpec, build_episode
from streamrl.rollout.episodes.base import _EPISODES
from streamrl.rollout.rewards import build_reward
from streamrl.rollout.selection import check_draws
from streamrl.run.assembly import episode_spec, rollout_spec, sampler_context


def test_a_rollout_spec_holds_the_sections_a_worker_reads_and_pickles() -> None:
    cfg = load_config(
        None,
        ["seed=7", "rollout.group_size=3", "stream.max_staleness=0", "agent.max_turns=2"],
    )
    spec = rollout_spec(cfg)
    for name in ("model", "rollout", "agent", "env", "reward", "algorithm", "selection"):
        assert getattr(spec, name) == getattr(cfg, name), name
    assert spec.context == RunContext.of(cfg) and spec.seed == 7
    assert (
        spec.episode
        == EpisodeSpec(rollout=cfg.rollout, agent=cfg.agent, env=cfg.env, seed=7)
        == episode_spec(cfg)
    )
    assert spec.engine_options == engine_options(cfg.rollout, 0)
    assert spec.engine_options["batch_invariant"] is True  # 'auto' at eta = 0
    # a worker in another process or on a Ray node receives it whole
    assert pickle.loads(pickle.dumps(spec)) == spec


def test_engine_options_resolve_batch_invariance_from_the_eta_passed() -> None:
    rollout = load_config(None, []).rollout  # batch_invariant: auto
    assert engine_options(rollout, 0)["batch_invariant"] is True
    assert engine_options(rollout, 1)["batch_invariant"] is False


def test_an_episode_factory_gets_the_episode_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    factory = lambda spec, tok, reward, sampling: seen.append((spec, sampling))  # noqa: E731
    monkeypatch.setitem(_EPISODES, "test_spec", factory)  # (removed after the test)
    cfg = load_config(None, ["rollout.episode=test_spec", "seed=3", "rollout.max_new_tokens=5"])
    build_episode(episode_spec(cfg), None, build_reward(cfg.reward), max_new_tokens=2)
    ((spec, sampling),) = seen
    assert spec == EpisodeSpec(rollout=cfg.rollout, agent=cfg.agent, env=cfg.env, seed=3)
    assert sampling.max_new_tokens == 2 and sampling.stop_token_ids == []  # no tokenizer


@pytest.mark.parametrize("model", ["tiny-small", "mlp", "saved"])
@pytest.mark.parametrize("episode", ["single_turn", "gym"])
def test_the_sampler_context_names_a_policy_run(tmp_path, model: str, episode: str) -> None:
    """A policy run: a gym episode, or a policy preset or saved policy as the model; its
    draws cannot be stratified (the rule's own check refuses it, naming why)."""
    if model == "saved":  # a directory saved by a policy run
        (tmp_path / "config.json").write_text(json.dumps({"streamrl_policy": {}}))
        model = str(tmp_path)
    overrides = [f"model.name_or_path={model}", f"rollout.episode={episode}"]
    run = sampler_context(load_config(None, overrides))
    policy = model != "tiny-small" or episode == "gym"
    assert run.policy is policy and run.endpoint is False and run.algorithm == "grpo"
    stratified = sampler_context(
        load_config(None, [*overrides, "rollout.group_sampling=stratified"])
    )
    if policy:
        with pytest.raises(ValueError, match="not environment policies"):
            check_draws(stratified)
    else:
        check_draws(stratified)


def test_the_env_episode_reads_its_section_and_the_built_reward() -> None:
    """``rollout.episode=env`` takes ``env.*`` from its spec and refuses a reward without
    an environment component, naming the components (read off the built reward)."""
    base = ["rollout.episode=env", "env.max_turns=3"]
    cfg = load_config(None, [*base, "reward.components=[{name: exact_match}]"])
    with pytest.raises(ValueError, match=r"needs env_return \(or env_win\), got \['exact_match'\]"):
        build_episode(episode_spec(cfg), None, build_reward(cfg.reward))
    cfg = load_config(None, [*base, "reward.components=[{name: env_return}, {name: env_win}]"])
    episode = build_episode(episode_spec(cfg), None, build_reward(cfg.reward))
    assert episode.max_turns == 3
