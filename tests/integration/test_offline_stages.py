"""The offline-to-online path in one run: SFT -> DPO -> A-LoL -> asynchronous GRPO, the
held-out accuracy after each stage, a stage stopped midway that resumes bit-exactly from
its checkpoint, and `streamrl data log-completions` making the stages' data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from streamrl.cli.main import main
from streamrl.run.checkpoint import latest_checkpoint
from streamrl.run.session import run_training
from streamrl.run.signals import GracefulStop, Interrupted
from streamrl.sources.logged import load_completions, load_preferences


def _data(tmp_path: Path) -> tuple[Path, Path]:
    prefs, log = tmp_path / "prefs.jsonl", tmp_path / "log.jsonl"
    pairs, rows = [], []
    for a in range(5):
        for b in range(5):
            p = f"{a}+{b}="
            pairs.append({"prompt": p, "chosen": str(a + b), "rejected": str(a + b + 1)})
            rows += [
                {"prompt": p, "completion": str(a + b), "reward": 1.0},
                {"prompt": p, "completion": str(a + b - 1), "reward": 0.0},
            ]
    prefs.write_text("".join(json.dumps(r) + "\n" for r in pairs))
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return prefs, log


def _stages(tmp_path: Path) -> list[str]:
    """SFT, DPO and A-LoL on the data written here, then 2 RL steps; a checkpoint every 2
    steps, and the final weights saved (the resume is compared by them)."""
    prefs, log = _data(tmp_path)
    return [
        "data.options={digits: 1, operators: '+', heldout_size: 8}",
        "sft.steps=2",
        "sft.examples_per_step=8",
        f"dpo.path={prefs}",
        "dpo.steps=4",
        "dpo.pairs_per_step=4",
        "dpo.lr=0.003",
        f"alol.path={log}",
        "alol.steps=4",
        "alol.examples_per_step=4",
        "alol.lr=0.003",
        "train.steps=2",
        "train.items_per_step=2",
        "train.micro_batch_sequences=4",
        "rollout.group_size=2",
        "rollout.max_new_tokens=3",
        "stream.max_staleness=0",
        "algorithm.dynamic_sampling=false",
        "run.checkpoint_every=2",
        "run.keep_checkpoints=2",
        "run.save_weights=true",
        "runtime.threads=1",
    ]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model" / "model.safetensors"))


@pytest.mark.parametrize("stage", ["dpo", "alol"])
def test_a_stage_stopped_midway_resumes_bit_exactly(
    tmp_path: Path, tiny_config, stage: str
) -> None:
    full = run_training(tiny_config(*_stages(tmp_path), "run.name=full"))
    summary = full.summary
    for key in ("after_sft", "after_dpo", "after_alol", "before", "after"):
        assert f"eval_accuracy_{key}" in summary, key
    assert summary["eval_accuracy_after_alol"] == summary["eval_accuracy_before"]
    assert summary["dpo/pairs"] == 25 and summary["alol/positive_rows"] == 25

    stop = GracefulStop()

    def progress(name: str, step: int, total: int, m: dict) -> None:
        if (name, step) == (stage, 3):  # after step 3 of 4: between two checkpoints
            stop.request()

    cfg = tiny_config(*_stages(tmp_path), "run.name=stopped")
    with pytest.raises(Interrupted, match=f"interrupted during {stage.upper()} at step 3"):
        run_training(cfg, progress, stop=stop)
    run_dir = tmp_path / "stopped"
    assert latest_checkpoint(run_dir).name == f"{stage}-000003"
    resumed = run_training(cfg, run_dir=run_dir, resume=True)
    a, b = _weights(tmp_path / "full"), _weights(run_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for name in ("sft", "dpo", "alol"):  # every step logged once, across the resume
        rows = (run_dir / f"{name}_metrics.jsonl").read_text().splitlines()
        steps = [json.loads(r)["step"] for r in rows]
        assert steps == list(range(getattr(cfg, name).steps)), (name, steps)
    assert resumed.summary["eval_accuracy_after_sft"] == summary["eval_accuracy_after_sft"]


def test_log_completions_writes_the_stages_data(tmp_path: Path, tiny_config, capsys) -> None:
    cfg = tiny_config(*_stages(tmp_path), "run.name=sft-only")
    cfg.dpo.steps = cfg.alol.steps = 0
    run_dir = run_training(cfg).run_dir
    log, prefs = tmp_path / "logged.jsonl", tmp_path / "pairs.jsonl"
    argv = ["data", "log-completions", str(run_dir), "--out", str(log), "--n", "3"]
    assert main([*argv, "--prompts", "6", "--preferences", str(prefs)]) == 0
    assert "18 completions" in capsys.readouterr().out
    rows = load_completions(log)  # what alol.path reads
    assert len(rows) == 18 and {r.reward for r in rows} <= {0.0, 1.0}
    assert len({r.item.prompt for r in rows}) == 6
    for pair in load_preferences(prefs) if prefs.stat().st_size else []:
        same = [r for r in rows if r.item.prompt == pair.item.prompt]
        best = max(r.reward for r in same)
        assert any(r.completion == pair.chosen and r.reward == best for r in same)
