"""Where the controller runs (this process, or a Ray trainer actor), and resuming runs.

``train(cfg)`` is what ``streamrl train`` calls; ``resume_config(run_dir, overrides)``
gives the config ``streamrl train --resume RUN_DIR`` continues with. With
``runtime.backend=ray`` the whole controller runs inside a trainer actor (with the
cores the placement gives the trainer); if that actor dies, the driver starts a new
one from the latest checkpoint, up to ``runtime.max_trainer_restarts`` times. The
driver holds the run directory's lock for its actors.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from streamrl.analysis.runs import flatten
from streamrl.config import Config, ConfigError, config_to_dict, load_config
from streamrl.core.atomic import write_text
from streamrl.engines.train.group.program import Lead
from streamrl.engines.train.group.rendezvous import join, leave
from streamrl.run.group_run import run_ranked
from streamrl.run.lock import run_lock
from streamrl.run.progress import Progress as ConsoleProgress
from streamrl.run.ranks import Ranks
from streamrl.run.resume import completed_summary
from streamrl.run.session import Progress, RunResult, run_training
from streamrl.run.signals import GracefulStop, Interrupted
from streamrl.run.supervisor import TrainerFailed
from streamrl.run.tracking import default_run_name, make_run_dir
from streamrl.stream.backends import plan_placement

#: keys a resume may change: where and how the run executes, never what it computes
CHANGEABLE_ON_RESUME = (
    "runtime.",
    "train.world_size",  # the update is the same on any number of ranks (DCP reshards)
    "train.placement",
    "train.ray_strategy",
    "train.collective_timeout_s",
    "run.progress",
    "run.checkpoint_every",
    "run.keep_checkpoints",
    "eval.every",
    "rollout.max_consecutive_failures",
    "algorithm.max_dropped_in_a_row",
)


def check_saved_config(path: Path) -> None:
    """A run's ``config.yaml`` is whole: text, YAML, a mapping with every top-level key a
    saved config has (an empty or cut file would silently resume with defaults)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}): damaged") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: invalid YAML ({problem}): damaged") from None
    sections = list(Config.model_fields)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: empty or not a mapping of sections: damaged")
    missing = [k for k in sections if k not in data]
    if missing:
        raise ConfigError(
            f"{path}: no {missing[0]!r} at the top level ({len(missing)} of {len(sections)} "
            "missing): not a whole saved config (cut short?)"
        )


def resume_config(run_dir: str | Path, overrides: list[str]) -> Config:
    """The run's own config, with overrides of the keys a resume may change."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"--resume {run_dir}: not a run directory (no config.yaml)")
    check_saved_config(path)
    original = flatten(config_to_dict(load_config(path)))
    cfg = load_config(path, overrides)
    changed = {
        k: (original.get(k), v)
        for k, v in flatten(config_to_dict(cfg)).items()
        if original.get(k) != v and not k.startswith(CHANGEABLE_ON_RESUME)
    }
    if changed:
        key, (was, now) = next(iter(changed.items()))
        raise ConfigError(
            f"--resume {run_dir}: {key} cannot change on resume (was {was!r}, given {now!r}): "
            "it would break the run; only runtime.*, train.world_size and its placement keys, "
            "run.progress, run.checkpoint_every, run.keep_checkpoints, eval.every, "
            "rollout.max_consecutive_failures and algorithm.max_dropped_in_a_row may"
        )
    return cfg


def train(
    cfg: Config,
    progress: Progress | None = None,
    *,
    resume_dir: str | Path | None = None,
    stop: GracefulStop | None = None,
) -> RunResult:
    """Run ``cfg`` (``resume_dir``: continue that run); with ``runtime.backend=ray`` the
    loop runs in a Ray actor."""
    run_dir = Path(resume_dir) if resume_dir is not None else None
    if cfg.runtime.backend == "ray" or _ray_group(cfg):
        placement = plan_placement(cfg.runtime)
        cpus = 1 if placement.colocated else placement.trainer_threads
        workers = 0 if placement.colocated else placement.worker_threads
        slots = cpus + workers * len(placement.worker_cpus)  # what the actors will ask for
        return run_on_ray(cfg, cpus, run_dir, stop or GracefulStop(), slots=slots)
    if cfg.train.world_size > 1:
        return run_ranked(cfg, progress, run_dir, stop)
    return run_training(cfg, progress, run_dir=run_dir, resume=run_dir is not None, stop=stop)


def _ray_group(cfg: Config) -> bool:
    """The trainer's ranks are Ray actors (and the controller runs in rank 0's)."""
    return cfg.train.world_size > 1 and cfg.train.placement == "ray"


class _TrainerActor:
    """Runs the controller; ``request_stop`` reaches it while ``run`` is busy (the actor
    takes two calls at a time)."""

    def __init__(self) -> None:
        self.stop = GracefulStop()

    def ready(self) -> bool:
        return True

    def request_stop(self, signum: int) -> None:
        self.stop.request(signum)

    def rendezvous(self) -> tuple[str, int, str, int]:
        """Rank 0 of a rank group: where the others join it (:mod:`streamrl.run.ray_group`)."""
        from streamrl.run.ray_group import rendezvous_point

        return rendezvous_point()

    def run(
        self, cfg: Config, run_dir: str, resume: bool, group: tuple | None = None
    ) -> tuple[str, dict]:
        """The run; ``group``: (spec, address, port, restarts so far) when this actor is
        rank 0 of a rank group."""
        write_text(Path(run_dir) / "trainer.pid", str(os.getpid()))
        ranks = None
        if group is not None:
            spec, addr, port, restarts = group
            join(spec, 0, addr, port)
            ranks = Ranks(Lead(spec), restarts)
        try:
            # progress lines go to this actor's stderr, which Ray forwards to the driver;
            # the driver holds the run directory's lock
            result = run_training(
                cfg,
                ConsoleProgress(False),
                run_dir=Path(run_dir),
                resume=resume,
                stop=self.stop,
                lock=False,
                ranks=ranks,
            )
            if ranks is not None and ranks.lead is not None:
                ranks.lead.release()
        finally:
            leave()
        return str(result.run_dir), result.summary


def run_on_ray(
    cfg: Config,
    trainer_cpus: float,
    run_dir: Path | None,
    stop: GracefulStop,
    *,
    slots: float = 0,
) -> RunResult:
    """Run the controller in a Ray trainer actor, restarting it from the latest
    checkpoint when it dies. Returns the RunResult (no trainer object). ``slots``: the
    CPUs the trainer and rollout actors ask for, all of which a local instance offers."""
    from streamrl.run.preflight import preflight
    from streamrl.stream.backends.ray_actors import _ray, init_ray

    ray: Any = _ray()
    resume = run_dir is not None
    with contextlib.ExitStack() as held:
        if run_dir is not None:
            held.enter_context(run_lock(run_dir))
            done = completed_summary(run_dir)
            if done is not None:
                return RunResult(run_dir, done, None, already_completed=True)
        preflight(cfg, output_dir=not resume)  # fail here, not in an actor
        init_ray(cfg.runtime.ray_address, min_cpus=slots)
        cfg = cfg.model_copy(deep=True)
        cfg.run.output_dir = str(Path(cfg.run.output_dir).resolve())  # the actor's cwd may differ
        if run_dir is None:  # the driver names the directory, so a restart can find it
            name = cfg.run.name or default_run_name(cfg.seed)
            run_dir = make_run_dir(cfg.run.output_dir, name)
            held.enter_context(run_lock(run_dir))
        if _ray_group(cfg):
            from streamrl.run.ray_group import drive_group

            return drive_group(ray, cfg, _TrainerActor, run_dir.resolve(), resume, stop)
        return _drive_actors(ray, cfg, trainer_cpus, run_dir.resolve(), resume, stop)


def _drive_actors(
    ray: Any, cfg: Config, trainer_cpus: float, run_dir: Path, resume: bool, stop: GracefulStop
) -> RunResult:
    """The trainer actor's loop: start one, forward a stop, restart it if it dies."""
    from streamrl.stream.pool import START_TIMEOUT_S

    gpus = cfg.runtime.num_gpus
    cls = ray.remote(num_cpus=trainer_cpus, num_gpus=gpus, max_restarts=0, max_concurrency=2)(
        _TrainerActor
    )
    restarts = 0
    with stop:
        while True:
            actor = cls.remote()
            try:
                _wait_scheduled(ray, actor, trainer_cpus, START_TIMEOUT_S)
                ref = actor.run.remote(cfg, str(run_dir), resume)
                forwarded = False
                while not ray.wait([ref], timeout=0.5)[0]:
                    if stop.requested and not forwarded:
                        actor.request_stop.remote(stop.signum)
                        forwarded = True
                try:
                    out_dir, summary = ray.get(ref)
                    summary["trainer_restarts"] = restarts
                except ray.exceptions.RayTaskError as e:  # the controller raised
                    cause = e.as_instanceof_cause()
                    if isinstance(cause, Interrupted):
                        raise Interrupted(str(cause), stop.signum) from None
                    raise cause from None
                return RunResult(run_dir=Path(out_dir), summary=summary, trainer=None)
            except ray.exceptions.RayActorError as e:  # the trainer actor died
                restarts += 1
                if restarts > cfg.runtime.max_trainer_restarts:
                    raise TrainerFailed(
                        f"the Ray trainer actor died {restarts} times (runtime."
                        f"max_trainer_restarts={cfg.runtime.max_trainer_restarts}); last cause: "
                        f"{str(e).splitlines()[0][:300]}"
                    ) from None
                print(
                    f"streamrl: the trainer actor died ({type(e).__name__}); restarting it from "
                    f"the latest checkpoint in {run_dir} ({restarts}/"
                    f"{cfg.runtime.max_trainer_restarts})",
                    file=sys.stderr,
                    flush=True,
                )
                resume = True
                time.sleep(1.0)
            finally:
                ray.kill(actor)


def _wait_scheduled(ray: Any, actor: Any, cpus: float, timeout: float) -> None:
    try:
        ray.get(actor.ready.remote(), timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise RuntimeError(
            f"the Ray trainer actor (num_cpus={cpus}, runtime.num_gpus) was not scheduled within "
            f"{timeout:.0f}s; cluster resources: {ray.available_resources()}"
        ) from None
