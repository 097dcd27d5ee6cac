"""Invariant 3: eta = 0 is exactly synchronous on-policy training.

The streaming pipeline (rollout workers, sample stream, admission control) run with
max_staleness=0 must leave bit-identical weights to the plain synchronous loop of
``streamrl/recipes/grpo.py``, on every backend, from the same config: with the default
settings, so dynamic sampling drops groups and their refills join the engine's batches
whenever they are issued (the engine is batch-invariant, rollout.batch_invariant).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from streamrl.models import load_model_and_tokenizer
from streamrl.recipes import grpo
from streamrl.run.launch import train

STEPS = 3


# the run both paths train; its saved weights are what _compare reads
RUN = [
    "data.options={digits: 1, operators: '+', heldout_size: 8}",
    # a random model is never right; "contains a digit" gives a varying reward
    "reward.components=[{name: numeric_match}, "
    "{name: format_reward, weight: 0.5, options: {pattern: '(?s).*[0-9].*'}}]",
    "rollout.group_size=4",
    "rollout.max_new_tokens=4",
    "train.items_per_step=3",
    f"train.steps={STEPS}",
    "train.lr=0.01",
    "stream.max_staleness=0",
    "runtime.threads=1",
    "run.save_weights=true",
]


def _compare(result, cfg) -> None:
    # the saved checkpoint: with Ray the trainer lives (and dies) in an actor
    streamed = load_file(str(result.run_dir / "model" / "model.safetensors"))
    trainer, _ = grpo.grpo(cfg, log=lambda *a: None)
    plain = {k: v for k, v in trainer.model.state_dict().items() if k in streamed}
    assert len(plain) >= len(streamed) > 0  # a tied lm_head is saved once
    initial, _ = load_model_and_tokenizer(cfg.model.name_or_path, seed=cfg.seed)
    moved = [k for k, v in initial.state_dict().items() if not torch.equal(v, plain[k])]
    assert moved, "training did not change any weight: the comparison would be vacuous"
    for key in plain:
        assert torch.equal(streamed[key], plain[key]), f"{key} differs"


@pytest.mark.parametrize(
    "backend",
    [
        "local",
        pytest.param("process", marks=pytest.mark.slow),
        pytest.param("ray", marks=pytest.mark.slow),
    ],
)
def test_eta0_pipeline_equals_the_grpo_recipe(tiny_config, backend: str) -> None:
    """The same config, unchanged but for runtime.backend, on every backend."""
    if backend == "ray":
        pytest.importorskip("ray")
    cfg = tiny_config(*RUN, f"runtime.backend={backend}")
    result = train(cfg)
    _compare(result, cfg)
    assert result.summary["stream/consumed"] == STEPS * cfg.train.items_per_step
    # dynamic sampling dropped groups, and their refills were generated beside others
    assert result.summary["stream/filtered/zero_reward_std"] > 0


def test_eta0_on_three_engines_equals_the_one_engine_recipe(tiny_config) -> None:
    """Three rollout workers, each with its own engine and a third of the groups: every
    engine step batches other requests than the recipe's one engine does (without
    rollout.batch_invariant the weights differ on every seed tried), and the weights are
    the same."""
    extra = ("runtime.num_rollout_workers=3", "rollout.max_new_tokens=8")
    cfg = tiny_config(*RUN, *extra)
    _compare(train(cfg), cfg)


def test_eta0_with_a_cpu_hog_beside_it_and_against_a_second_run(
    tmp_path: Path, tiny_config
) -> None:
    """A busy loop on the cores changes every timing (which refill lands in which engine
    step), not the result: the same weights as the recipe, and as a run on a quiet
    machine the same items in every batch and the same training numbers at every step.
    (The stream's counters in a step's row are snapshots taken when the row is written:
    the next batch's items may have started by then.)"""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        loaded = train(tiny_config(*RUN, output_dir=tmp_path / "loaded"))
    finally:
        hog.kill()
        hog.wait()
    quiet = train(tiny_config(*RUN, output_dir=tmp_path / "quiet"))
    _compare(loaded, tiny_config(*RUN, output_dir=tmp_path / "loaded"))
    a, b = (load_file(str(r.run_dir / "model" / "model.safetensors")) for r in (loaded, quiet))
    assert all(torch.equal(a[k], b[k]) for k in a)
    batches = [
        [json.loads(x)["consumed"] for x in (r.run_dir / "ledger.jsonl").read_text().splitlines()]
        for r in (loaded, quiet)
    ]
    assert batches[0] == batches[1]
    rows = [
        [json.loads(x) for x in (r.run_dir / "metrics.jsonl").read_text().splitlines()]
        for r in (loaded, quiet)
    ]
    exact = ("loss", "policy_loss", "grad_norm", "entropy", "reward_mean", "reward_std")
    for x, y in zip(*rows, strict=True):  # every training number of every step
        keys = [k for k in x if k in exact or k.startswith("mismatch/")]
        assert [x[k] for k in keys] == [y[k] for k in keys]


def test_eta0_mismatch_kl_is_zero_where_weights_agree(tmp_path: Path, tiny_config) -> None:
    """At eta = 0 the trainer's log-prob of every generated token, on the weights that
    generated it, is the engine's bit for bit: mismatch/kl is exactly 0 at every step."""
    result = train(tiny_config(*RUN))
    rows = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "mismatch/kl" in r]
    assert len(steps) == STEPS
    for r in steps:
        assert r["mismatch/kl"] == 0.0 and r["mismatch/abs_log_ratio_mean"] == 0.0
        assert r["mismatch/ratio_min"] == r["mismatch/ratio_max"] == 1.0
    off = train(tiny_config(*RUN, "rollout.batch_invariant=false", output_dir=tmp_path / "off"))
    rows = [json.loads(x) for x in (off.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("mismatch/kl", 0.0) > 0.0 for r in rows)  # the default numerics differ


def test_recipe_equivalence_with_sft_kl_and_remax(tiny_config) -> None:
    """SFT first, a KL reference, ReMax's extra greedy rollout, a cosine schedule with
    warm-up and two minibatches (a separate proximal forward): still bit-identical."""
    cfg = tiny_config(
        *RUN,
        "sft.steps=3",
        "sft.examples_per_step=8",
        "algorithm.name=remax",
        "algorithm.kl.coef=0.05",
        "train.num_minibatches=2",
        "train.lr_schedule=cosine",
        "train.warmup_steps=1",
    )
    result = train(cfg)
    _compare(result, cfg)


def test_recipe_runs_from_the_command_line(tiny_config, capsys) -> None:
    cfg_args = tiny_config.args(
        "sft.steps=2",
        "sft.examples_per_step=8",
        "train.steps=2",
        "train.items_per_step=2",
        "rollout.group_size=2",
        "algorithm.dynamic_sampling=false",
    )
    assert grpo.main(cfg_args) == 0
    out = capsys.readouterr().out
    assert "[grpo] step 2/2" in out and "held-out greedy accuracy after GRPO" in out


def test_onednn_engine_weights_keep_the_recipe_equivalence(tiny_config) -> None:
    """rollout.engine_weights=onednn (the engine's fastest fp32 layout) on both paths."""
    cfg = tiny_config(*RUN, "rollout.engine_weights=onednn")
    _compare(train(cfg), cfg)


def test_stratified_groups_keep_the_recipe_equivalence(tmp_path: Path, tiny_config) -> None:
    """rollout.group_sampling=stratified goes through both paths alike, and it changes
    the draws: the weights differ from the independent recipe's."""
    cfg = tiny_config(*RUN, "rollout.group_sampling=stratified")
    result = train(cfg)
    _compare(result, cfg)
    streamed = load_file(str(result.run_dir / "model" / "model.safetensors"))
    independent, _ = grpo.grpo(
        tiny_config(*RUN, output_dir=tmp_path / "independent"), log=lambda *a: None
    )
    plain = independent.model.state_dict()
    assert any(not torch.equal(v, plain[k]) for k, v in streamed.items())
