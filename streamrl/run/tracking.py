"""Run directory, metric sinks and the run's provenance (config, versions, machine).

A run directory holds::

    run.lock           held by the process that trains the run (one writer at a time)
    config.yaml        the resolved config
    environment.json   package versions, git commit, machine, seed
    metrics.jsonl      one JSON object per logged step
    tb/                TensorBoard events (tb/<stage>/ for auxiliary stages, e.g. SFT)
    summary.json       final scalars (eval_accuracy_before/after, ...)
    run.log            warnings and recorded failures (reward errors, ...)
    model/             final weights (safetensors) + tokenizer
    wandb/ wandb_id    the W&B run and its id (run.wandb=true)
    mlruns/ mlflow_run_id  the MLflow file store and run id (run.mlflow=true)
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamrl.core.atomic import WriteError, reason, replacing, write_text
from streamrl.run.files import STEP_ROW, UnreadableFile, read_json, read_jsonl

if TYPE_CHECKING:
    from streamrl.config import Config
    from streamrl.run.sinks import MetricSink

TRACKED_PACKAGES = (
    "streamrl",
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "accelerate",
    "gguf",
    "peft",
    "datasets",
    "math-verify",
    "reasoning-gym",
    "pydantic",
    "numpy",
    "ray",
    "rliable",
    "adastop",
    "wandb",
    "mlflow",
    "mlflow-skinny",
)


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in TRACKED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def git_commit(path: str | Path = ".") -> str | None:
    try:
        res = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip() or None if res.returncode == 0 else None


def machine_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def make_run_dir(output_dir: str, name: str) -> Path:
    """A fresh directory ``output_dir/name`` (suffixed -1, -2, ... if taken)."""
    base = Path(output_dir) / name
    path, n = base, 0
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    path.mkdir(parents=True)
    return path


def write_json(path: Path, data: Any) -> None:
    """Replace ``path`` with ``data`` as JSON, atomically (:mod:`streamrl.core.atomic`)."""
    write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def kept_rows(path: Path, through_step: int) -> list[dict[str, Any]]:
    """The rows of a step log (``metrics.jsonl``, ``ledger.jsonl``) with ``step <=
    through_step``; a damaged row is an :class:`UnreadableFile` naming its line."""
    return [r for r in read_jsonl(path, STEP_ROW) if r["step"] <= through_step]


def truncate_jsonl(path: Path, through_step: int) -> int:
    """Keep the rows of ``path`` with ``step <= through_step``; returns the last kept step."""
    rows = kept_rows(path, through_step)
    if path.exists():
        write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
    return max((r["step"] for r in rows), default=-1)


def _append(file: Any, path: Path, line: str) -> None:
    """Append one line to an open log and flush it; a failure names the file."""
    try:
        file.write(line)
        file.flush()
    except OSError as e:
        raise WriteError(f"cannot append to {path}: {reason(e)}") from e


class MetricsLogger:
    """Appends one JSON object per step to metrics.jsonl and mirrors it to TensorBoard
    and to any extra sinks (W&B, MLflow: `streamrl.run.sinks`).

    ``resume=True`` keeps existing lines and ignores steps at or below the last
    logged one, so a restarted run does not duplicate steps in any sink: TensorBoard
    purges events past that step (``purge_step``) and the other sinks only ever see
    new steps. ``keep_through={stage: step}`` (a resume from a checkpoint; stage ``""``
    is the main file) first drops the rows a killed process wrote after the
    checkpoint, so they are logged again, once, by the resumed run. ``time_offset``
    continues ``wall_time`` across processes. Auxiliary stages (``log_aux``, e.g. SFT) count their steps separately,
    in ``<stage>_metrics.jsonl`` and their own TensorBoard directory ``tb/<stage>``
    (a purge there cannot touch the main curves).
    """

    def __init__(
        self,
        run_dir: Path,
        tensorboard: bool = True,
        resume: bool = False,
        sinks: Sequence[MetricSink] = (),
        keep_through: dict[str, int] | None = None,
        time_offset: float = 0.0,
    ):
        self.run_dir = run_dir
        self.keep_through = keep_through or {}
        self.path = run_dir / "metrics.jsonl"
        self.resume = resume
        self.tensorboard = tensorboard
        self.sinks = list(sinks)
        self.last_step = self._open_last_step(self.path, "")
        self._file = self.path.open("a")
        self._tb = self._writer(run_dir / "tb", self.last_step)
        self._aux: dict[str, Any] = {}  # stage -> (file, TensorBoard writer)
        self._aux_last: dict[str, int] = {}
        self._t0 = time.time() - time_offset

    def _open_last_step(self, path: Path, stage: str) -> int:
        """The last step already in ``path`` when resuming (else the file is removed), or -1."""
        if not self.resume:
            path.unlink(missing_ok=True)
            return -1
        if stage in self.keep_through:
            return truncate_jsonl(path, self.keep_through[stage])
        rows = read_jsonl(path, STEP_ROW)
        return max((r["step"] for r in rows), default=-1)

    def _writer(self, log_dir: Path, last_step: int) -> Any:
        if not self.tensorboard:
            return None
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(log_dir=str(log_dir), purge_step=last_step + 1)

    def _write(self, file: Any, tb: Any, step: int, metrics: dict[str, float], prefix: str):
        row = {"step": step, "wall_time": time.time() - self._t0, **metrics}
        _append(file, Path(file.name), json.dumps(row, default=float) + "\n")
        if tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)):
                    tb.add_scalar(f"{prefix}{key}", value, step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if step <= self.last_step:
            return
        self._write(self._file, self._tb, step, metrics, "")
        for sink in self.sinks:
            sink.log(step, metrics)
        self.last_step = step

    def log_aux(self, stage: str, step: int, metrics: dict[str, float]) -> None:
        """Metrics of an auxiliary stage (e.g. SFT) -> ``<stage>_metrics.jsonl`` + TB
        (tags ``<stage>/<key>``) + sinks (keys ``<stage>/<key>``)."""
        if stage not in self._aux:
            path = self.path.parent / f"{stage}_metrics.jsonl"
            self._aux_last[stage] = self._open_last_step(path, stage)
            tb = self._writer(self.run_dir / "tb" / stage, self._aux_last[stage])
            self._aux[stage] = (path.open("a"), tb)
        if step <= self._aux_last[stage]:
            return
        file, tb = self._aux[stage]
        self._write(file, tb, step, metrics, f"{stage}/")
        for sink in self.sinks:
            sink.log(step, metrics, stage=stage)
        self._aux_last[stage] = step

    def close(self) -> None:
        """Close every file, TensorBoard writer and sink, even if one fails (then the
        first failure is raised)."""
        files = [self._file, *(file for file, _ in self._aux.values())]
        writers = [tb for tb in (self._tb, *(tb for _, tb in self._aux.values())) if tb]
        close_all([*(f.close for f in files), *(w.close for w in writers), *self.sinks])


def close_all(closers: Sequence[Any]) -> None:
    """Call every ``close`` (a callable, or an object with ``close``), even if one fails;
    then raise the first failure (a file's names it)."""
    errors = []
    for close in closers:
        try:
            (close if callable(close) else close.close)()
        except OSError as e:
            name = getattr(getattr(close, "__self__", None), "name", None)
            errors.append(WriteError(f"cannot write {name}: {reason(e)}") if name else e)
        except Exception as e:
            errors.append(e)
    if errors:
        raise errors[0]


class _RunLogHandler(logging.FileHandler):
    """run.log; if it cannot be written (a full disk), one line on stderr, once, instead
    of logging's traceback per record."""

    failed = False

    def handleError(self, record: logging.LogRecord) -> None:
        if not self.failed:
            self.failed = True
            err = sys.exc_info()[1]
            print(
                f"streamrl: cannot write {self.baseFilename} ({reason(err) if err else '?'}); "
                "its later lines are lost",
                file=sys.stderr,
                flush=True,
            )


def setup_run_log(run_dir: Path) -> logging.Logger:
    """The run's log file: warnings and every recorded failure, with error text."""
    logger = logging.getLogger(f"streamrl.run.{run_dir}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    for old in list(logger.handlers):  # an earlier run of this directory in this process
        logger.removeHandler(old)
        old.close()
    handler = _RunLogHandler(run_dir / "run.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    return logger


def note(run: RunDirectory | None, message: str) -> None:
    """A line for the console (stderr) and, once the run is open, run.log."""
    print(f"streamrl: {message}", file=sys.stderr, flush=True)
    if run is not None:
        run.log.warning("%s", message)


def read_summary(run_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(summary.json's contents, None), or (None, why it cannot be read); (None, None) if
    there is none."""
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        return None, None
    try:
        return read_json(path, {"status": str}), None
    except UnreadableFile as e:
        return None, str(e)


class RunDirectory:
    """A run's directory and its provenance, in one object.

    ``create`` makes ``run.output_dir/<name>`` (or uses a directory made for it) and
    writes ``config.yaml`` and ``environment.json`` (package versions, git commit,
    machine, seed, command line), opens ``run.log`` and the metric sinks
    (``metrics.jsonl``, TensorBoard, W&B, MLflow). ``reopen`` continues a run after a
    resume. ``ledger.jsonl`` records, per step, how every item ended. ``finish`` writes
    ``summary.json`` with a ``status``: completed, interrupted or failed.
    """

    def __init__(self, path: Path, log: logging.Logger, metrics: MetricsLogger) -> None:
        self.path, self.log, self.metrics = path, log, metrics
        self._ledger = (path / "ledger.jsonl").open("a")

    @classmethod
    def create(cls, cfg: Config, path: Path | None = None) -> RunDirectory:
        from streamrl.config import save_config
        from streamrl.run.sinks import build_sinks

        if path is None:
            name = cfg.run.name or default_run_name(cfg.seed)
            path = make_run_dir(cfg.run.output_dir, name)
        path.mkdir(parents=True, exist_ok=True)
        with replacing(path / "config.yaml") as tmp:
            save_config(cfg, tmp)
        write_json(
            path / "environment.json",
            {
                "packages": package_versions(),
                "git_commit": git_commit(Path(__file__).parent),
                "machine": machine_info(),
                "seed": cfg.seed,
                "argv": os.environ.get("STREAMRL_ARGV", ""),
            },
        )
        for stale in ("ledger.jsonl", "summary.json"):  # a run started over in its directory
            (path / stale).unlink(missing_ok=True)
        log = setup_run_log(path)
        sinks = build_sinks(cfg, path)  # W&B / MLflow when run.wandb / run.mlflow
        return cls(path, log, MetricsLogger(path, tensorboard=cfg.run.tensorboard, sinks=sinks))

    @classmethod
    def reopen(
        cls, cfg: Config, path: Path, keep_through: dict[str, int], time_offset: float
    ) -> RunDirectory:
        """An existing run continued from a checkpoint: rows past it are dropped. Every
        log is read (a damaged row is one error naming its line) before any is changed."""
        from streamrl.run.sinks import build_sinks

        logs = {"": "metrics.jsonl", **{s: f"{s}_metrics.jsonl" for s in keep_through if s}}
        for stage, name in logs.items():
            kept_rows(path / name, keep_through.get(stage, -1))
        truncate_jsonl(path / "ledger.jsonl", keep_through.get("", -1))
        (path / "summary.json").unlink(missing_ok=True)
        log = setup_run_log(path)
        metrics = MetricsLogger(
            path,
            tensorboard=cfg.run.tensorboard,
            resume=True,
            sinks=build_sinks(cfg, path, resume=True),
            keep_through=keep_through,
            time_offset=time_offset,
        )
        return cls(path, log, metrics)

    def write_ledger(self, step: int, entries: list[tuple[int, str, str]]) -> None:
        """How items ended during ``step``: consumed indices, filtered/failed by reason."""
        if not entries:
            return
        row: dict[str, Any] = {"step": step, "consumed": []}
        for index, outcome, why in entries:
            if outcome == "consumed":
                row["consumed"].append(index)
            else:
                row.setdefault(outcome, {}).setdefault(why, []).append(index)
        _append(self._ledger, self.path / "ledger.jsonl", json.dumps(row) + "\n")

    def finish(self, summary: dict[str, Any], status: str = "completed") -> None:
        """Close the logs and sinks and write ``summary.json`` (``status``: completed,
        interrupted or failed), atomically; it is written even if a close fails (that
        failure is raised after it)."""
        try:
            close_all([self._ledger.close, self.metrics.close])
        finally:
            write_json(self.path / "summary.json", {**summary, "status": status})
            self.log.info("run %s: %s", status, self.path)


def default_run_name(seed: int) -> str:
    return f"run-{time.strftime('%Y%m%d-%H%M%S')}-s{seed}"
