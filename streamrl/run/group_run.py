"""The run with a local rank group (``train.world_size > 1``, ``train.placement:
local``): start the group, train, and on a rank's death or hang tear the whole group
down and continue from the latest checkpoint (:mod:`streamrl.run.ranks`)."""

from __future__ import annotations

from pathlib import Path

from streamrl.config import Config
from streamrl.run.assembly import group_spec
from streamrl.run.ranks import RESTARTS, Ranks, TrainerFailed, collective_failure, start_local
from streamrl.run.resume import completed_summary
from streamrl.run.session import Progress, RunResult, resolve_device, run_training
from streamrl.run.signals import GracefulStop
from streamrl.run.tracking import default_run_name, make_run_dir, note


def run_ranked(
    cfg: Config,
    progress: Progress | None,
    run_dir: Path | None,
    stop: GracefulStop | None,
) -> RunResult:
    """Train ``cfg`` (``run_dir``: continue that run) with its rank group, restarting the
    group from the latest checkpoint when a rank fails."""
    from streamrl.run.preflight import preflight

    resume = run_dir is not None
    if run_dir is None:  # named here, so a restart finds it
        preflight(cfg, output_dir=True)
        run_dir = make_run_dir(cfg.run.output_dir, cfg.run.name or default_run_name(cfg.seed))
    elif completed_summary(run_dir) is not None:
        return run_training(cfg, progress, run_dir=run_dir, resume=True, stop=stop)
    spec = group_spec(cfg, resolve_device(cfg.runtime.device))
    ranks = Ranks(lead=None)
    while True:
        group = None
        try:
            group, ranks.lead = start_local(spec, run_dir)
            result = run_training(
                cfg, progress, run_dir=run_dir, resume=resume, stop=stop, ranks=ranks
            )
            ranks.lead.release()
            group.close()
            result.summary[RESTARTS] = len(ranks.restarts)
            return result
        except Exception as e:
            why = collective_failure(e, group.failure(wait_s=1.0) if group is not None else None)
            if why is None:
                raise
        finally:  # (after a clean close: nothing left to do)
            if group is not None:
                group.close(grace_s=0)
        restart(cfg, ranks.restarts, run_dir, why)
        resume = True


def restart(cfg: Config, restarts: list[str], run_dir: Path, why: str) -> None:
    """Count a restart in ``restarts`` (their causes), or fail the run when there have
    been too many."""
    limit = cfg.runtime.max_trainer_restarts
    if len(restarts) >= limit:
        raise TrainerFailed(
            f"the trainer's rank group failed {len(restarts) + 1} times "
            f"(runtime.max_trainer_restarts={limit}); last cause: {why}"
        ) from None
    restarts.append(why)
    note(
        None,
        f"the trainer's rank group failed ({why}); restarting it from the latest checkpoint "
        f"in {run_dir} ({len(restarts)}/{limit})",
    )
