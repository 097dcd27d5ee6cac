"""Metric sinks (TensorBoard, W&B offline, MLflow file store) and resuming a run's logs.

W&B and MLflow are optional extras (`pip install 'streamrl[tracking]'`); their tests
skip when the package is missing.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from streamrl.config import load_config
from streamrl.run.sinks import MlflowSink, WandbSink, build_sinks
from streamrl.run.tracking import MetricsLogger

CONFIG = {"seed": 3, "train": {"steps": 8, "lr": 0.001}}


def two_sessions(run_dir: Path, make_sinks) -> tuple[list, list]:
    """Log steps 0..4 (+ SFT 0..2), "crash", resume and log steps 3..7 (+ SFT 0..2 again)."""
    sessions = []
    for steps, resume in ((range(0, 5), False), (range(3, 8), True)):
        sinks = make_sinks(resume)
        logger = MetricsLogger(run_dir, tensorboard=True, resume=resume, sinks=sinks)
        for s in range(3):
            logger.log_aux("sft", s, {"loss": 1.0 / (s + 1)})
        for s in steps:
            logger.log(s, {"reward_mean": s / 10, "time/step": 0.5, "note": "text"})
        logger.close()
        sessions.append(sinks)
    return sessions[0], sessions[1]


def jsonl_steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line]


def test_resume_logs_each_step_once_in_jsonl_and_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    two_sessions(tmp_path, lambda resume: [])
    assert jsonl_steps(tmp_path / "metrics.jsonl") == list(range(8))
    assert jsonl_steps(tmp_path / "sft_metrics.jsonl") == [0, 1, 2]
    main = EventAccumulator(str(tmp_path / "tb"))
    main.Reload()
    assert [e.step for e in main.Scalars("reward_mean")] == list(range(8))
    sft = EventAccumulator(str(tmp_path / "tb" / "sft"))
    sft.Reload()
    assert [e.step for e in sft.Scalars("sft/loss")] == [0, 1, 2]  # not purged by the RL resume


def test_fresh_logger_starts_over(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log(0, {"a": 1.0})
    logger.log(1, {"a": 1.0})
    logger.close()
    logger = MetricsLogger(tmp_path, tensorboard=False)  # resume=False: a new run
    logger.log(0, {"a": 2.0})
    logger.close()
    assert jsonl_steps(tmp_path / "metrics.jsonl") == [0]


def test_mlflow_resume_has_no_duplicate_steps(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    first, second = two_sessions(
        tmp_path, lambda resume: [MlflowSink(tmp_path, "demo", CONFIG, resume=resume)]
    )
    run_id = (tmp_path / "mlflow_run_id").read_text().strip()
    assert first[0].run_id == second[0].run_id == run_id  # the same run, reopened
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    history = client.get_metric_history(run_id, "reward_mean")
    assert sorted(m.step for m in history) == list(range(8))
    assert [m.step for m in client.get_metric_history(run_id, "sft/loss")] == [0, 1, 2]
    run = client.get_run(run_id)
    assert run.info.run_name == "demo" and run.info.status == "FINISHED"
    assert run.data.params["train.steps"] == "8" and run.data.params["seed"] == "3"
    assert "time/step" in run.data.metrics and "note" not in run.data.metrics


def wandb_history(run_dir: Path) -> list[dict]:
    """History rows of every offline W&B run file under ``run_dir`` (LevelDB-style log of
    protobuf records: 7-byte file header, 32 KiB blocks, 7-byte record headers)."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        data = path.read_bytes()
        if data[:4] != b":W&B":
            pytest.skip(f"unknown W&B offline file format in {path.name}")
        pos, buf = 7, b""
        while pos + 7 <= len(data):
            space = 32768 - pos % 32768
            if space < 7:  # block trailer padding
                pos += space
                continue
            _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
            buf += data[pos + 7 : pos + 7 + length]
            pos += 7 + length
            if kind in (1, 4):  # FULL or LAST fragment
                record = pb.Record()
                record.ParseFromString(buf)
                buf = b""
                if record.WhichOneof("record_type") == "history":
                    items = record.history.item
                    rows.append(
                        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
                    )
    return rows


@pytest.mark.slow  # two sessions through wandb's offline writer
def test_wandb_offline_resume_has_no_duplicate_steps(tmp_path: Path) -> None:
    wandb = pytest.importorskip("wandb")
    first, second = two_sessions(
        tmp_path, lambda resume: [WandbSink(tmp_path, "demo", CONFIG, resume=resume)]
    )
    run_id = (tmp_path / "wandb_id").read_text().strip()
    assert first[0].run_id == second[0].run_id == run_id
    # the sinks' own record: session 2 sent only new steps
    assert first[0].logged_steps == {"": [0, 1, 2, 3, 4], "sft": [0, 1, 2]}
    assert second[0].logged_steps == {"": [5, 6, 7]}
    # and the offline run files agree, once the W&B service has flushed and exited
    wandb.teardown()
    rows = wandb_history(tmp_path)
    files = sorted(p.name for p in tmp_path.glob("wandb/*"))
    steps = sorted(r["step"] for r in rows if "reward_mean" in r)
    assert steps == list(range(8)), (files, rows)
    assert [r["sft/step"] for r in rows if "sft/loss" in r] == [0, 1, 2]


def test_train_wires_sinks_from_config(tiny_config) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from streamrl.run.launch import train

    cfg = tiny_config(
        "train.steps=2",
        "train.items_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=3",
        "algorithm.dynamic_sampling=false",
        "run.mlflow=true",
        "run.name=wired",
    )
    run_dir = train(cfg).run_dir
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    run = client.get_run((run_dir / "mlflow_run_id").read_text().strip())
    assert run.info.run_name == "wired" and run.data.params["run.mlflow"] == "True"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "eval/accuracy")]
    assert steps == [0, 2]  # before RL and after the last step


def test_no_sinks_by_default_and_missing_extra_is_explained(tmp_path, monkeypatch) -> None:
    assert build_sinks(load_config(None, []), tmp_path) == []
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'streamrl\[wandb\]'"):
        build_sinks(load_config(None, ["run.wandb=true"]), tmp_path)
