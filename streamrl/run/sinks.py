"""Optional metric sinks beside metrics.jsonl and TensorBoard: Weights & Biases and MLflow.

Switched on by config (``run.wandb=true``, ``run.mlflow=true``) and fed by
`streamrl.run.tracking.MetricsLogger`, which drops steps at or below the last one already
logged, so a resumed run never sends a step twice. Each sink keeps its run's id in the
run directory (``wandb_id``, ``mlflow_run_id``) and, with ``resume=True``, continues
that run instead of starting a new one.

The packages are optional and imported only when a sink is built::

    pip install 'streamrl[wandb]'    # W&B; the default mode is offline (``wandb sync`` later)
    pip install 'streamrl[mlflow]'   # MLflow; the default store is RUN_DIR/mlruns
"""

from __future__ import annotations

import importlib
import os
import re
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from streamrl.core.atomic import write_text

if TYPE_CHECKING:
    from streamrl.config import Config


@runtime_checkable
class MetricSink(Protocol):
    """Receives each logged step. ``stage`` names an auxiliary stage (e.g. ``"sft"``) whose
    steps count separately; its keys arrive without the ``stage/`` prefix."""

    def log(self, step: int, metrics: Mapping[str, Any], stage: str | None = None) -> None: ...

    def close(self) -> None: ...


def _require(module: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"run.{extra}=true needs the {module!r} package: pip install 'streamrl[{extra}]'"
        ) from e


def _scalars(metrics: Mapping[str, Any], stage: str | None) -> dict[str, float]:
    """Numeric values only, keys prefixed ``stage/`` for an auxiliary stage."""
    prefix = f"{stage}/" if stage else ""
    return {f"{prefix}{k}": float(v) for k, v in metrics.items() if isinstance(v, (int, float))}


def _stored_id(path: Path, resume: bool) -> str | None:
    if resume and path.is_file():
        return path.read_text().strip() or None
    return None


class WandbSink:
    """Logs to a W&B run named after the run directory, with the resolved config.

    The run id lives in ``RUN_DIR/wandb_id``; a resumed logger reopens it with
    ``resume="allow"``. Steps are a custom x-axis (``step``, ``<stage>/step``) rather
    than W&B's own ``_step``, so SFT steps and RL steps do not have to interleave.
    ``logged_steps`` records what this sink sent, per stage ("" for the main stage).
    """

    def __init__(
        self,
        run_dir: Path,
        name: str,
        config: Mapping[str, Any],
        project: str = "streamrl",
        mode: str = "offline",
        resume: bool = False,
    ) -> None:
        wandb = _require("wandb", "wandb")
        id_path = Path(run_dir) / "wandb_id"
        run_id = _stored_id(id_path, resume) or uuid.uuid4().hex[:12]
        write_text(id_path, run_id + "\n")
        self.run = wandb.init(
            project=project,
            name=name,
            id=run_id,
            resume="allow",
            mode=mode,
            dir=str(run_dir),
            config=dict(config),
            settings=_wandb_settings(wandb),
        )
        self.run_id = run_id
        self._defined: set[str] = set()
        self.logged_steps: dict[str, list[int]] = {}

    def log(self, step: int, metrics: Mapping[str, Any], stage: str | None = None) -> None:
        step_key = f"{stage}/step" if stage else "step"
        row = _scalars(metrics, stage)
        for key in row.keys() - self._defined:
            self.run.define_metric(key, step_metric=step_key)
            self._defined.add(key)
        self.run.log({**row, step_key: step})
        self.logged_steps.setdefault(stage or "", []).append(step)

    def close(self) -> None:
        self.run.finish()


def _wandb_settings(wandb: Any) -> Any:
    """Quiet, no console capture, no system-stats sampler (it would compete for cores)."""
    try:
        return wandb.Settings(silent=True, console="off", x_disable_stats=True)
    except Exception:  # wandb < 0.19 spells the stats switch `_disable_stats`
        return wandb.Settings(silent=True, console="off")


class MlflowSink:
    """Logs to an MLflow run named after the run directory; the config becomes params.

    The tracking URI defaults to a file store in ``RUN_DIR/mlruns`` (MLflow >= 3 wants
    ``MLFLOW_ALLOW_FILE_STORE=true`` for it, which is set unless already set). The run id
    lives in ``RUN_DIR/mlflow_run_id``; a resumed logger reopens that run.
    """

    def __init__(
        self,
        run_dir: Path,
        name: str,
        config: Mapping[str, Any],
        tracking_uri: str | None = None,
        experiment: str = "streamrl",
        resume: bool = False,
    ) -> None:
        _require("mlflow", "mlflow")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        run_dir = Path(run_dir)
        self.tracking_uri = tracking_uri or (run_dir / "mlruns").resolve().as_uri()
        if "://" not in self.tracking_uri or self.tracking_uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        id_path = run_dir / "mlflow_run_id"
        run_id = _stored_id(id_path, resume)
        if run_id is not None:
            self.client.update_run(run_id, status="RUNNING")  # raises if the store lost it
        else:
            found = self.client.get_experiment_by_name(experiment)
            exp_id = found.experiment_id if found else self.client.create_experiment(experiment)
            run_id = self.client.create_run(exp_id, run_name=name).info.run_id
            params = [Param(k, _param_value(v)) for k, v in _flat(config).items()]
            for i in range(0, len(params), 100):  # log_batch takes at most 100 params
                self.client.log_batch(run_id, params=params[i : i + 100])
            self.client.log_dict(run_id, dict(config), "config.json")
            write_text(id_path, run_id + "\n")
        self.run_id = run_id
        self.logged_steps: dict[str, list[int]] = {}

    def log(self, step: int, metrics: Mapping[str, Any], stage: str | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(_metric_key(k), v, now, step) for k, v in _scalars(metrics, stage).items()]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)
        self.logged_steps.setdefault(stage or "", []).append(step)

    def close(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")


def _metric_key(key: str) -> str:
    """MLflow keys allow alphanumerics and ``_-. :/``; anything else becomes ``_``."""
    return re.sub(r"[^\w\-. :/]", "_", key)


def _param_value(value: Any, limit: int = 500) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _flat(config: Mapping[str, Any]) -> dict[str, Any]:
    from streamrl.analysis.runs import flatten  # the same dotted keys `streamrl compare` uses

    return flatten(config)


def build_sinks(cfg: Config, run_dir: Path, resume: bool = False) -> list[MetricSink]:
    """The sinks ``cfg.run`` switches on, each named after the run directory."""
    from streamrl.config import config_to_dict

    r = cfg.run
    config = config_to_dict(cfg)
    sinks: list[MetricSink] = []
    try:
        if r.wandb:
            sinks.append(
                WandbSink(run_dir, run_dir.name, config, r.wandb_project, r.wandb_mode, resume)
            )
        if r.mlflow:
            sinks.append(
                MlflowSink(
                    run_dir,
                    run_dir.name,
                    config,
                    r.mlflow_tracking_uri,
                    r.mlflow_experiment,
                    resume,
                )
            )
    except BaseException:
        for sink in sinks:  # do not leave a half-built set of runs open
            sink.close()
        raise
    return sinks
