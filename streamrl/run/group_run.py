"""The run with a local rank group (``train.world_size > 1``, ``train.placement:
local``). The ``streamrl train`` process supervises (:mod:`streamrl.run.supervisor`):
it names and locks the run directory and runs rank 0 in a child process, which spawns
ranks 1..N-1 and trains. When any rank dies or hangs (rank 0 included), the whole group
is torn down and rank 0 starts again, continuing from the latest checkpoint
(:mod:`streamrl.run.ranks`)."""

from __future__ import annotations

from pathlib import Path

from streamrl.config import Config
from streamrl.engines.train.group.spec import RankGroupFailed
from streamrl.run.lock import run_lock
from streamrl.run.resume import completed_summary
from streamrl.run.session import Progress, RunResult
from streamrl.run.signals import GracefulStop
from streamrl.run.supervisor import supervise
from streamrl.run.tracking import default_run_name, make_run_dir


def run_ranked(
    cfg: Config,
    progress: Progress | None,
    run_dir: Path | None,
    stop: GracefulStop | None,
) -> RunResult:
    """Train ``cfg`` (``run_dir``: continue that run) with its rank group, restarting the
    group from the latest checkpoint when a rank fails. Holds the run directory's lock."""
    from streamrl.run.preflight import preflight
    from streamrl.run.ranks import RESTARTS

    resume = run_dir is not None
    if run_dir is None:  # named here, so a restart finds it
        preflight(cfg, output_dir=True)
        run_dir = make_run_dir(cfg.run.output_dir, cfg.run.name or default_run_name(cfg.seed))
    with run_lock(run_dir):
        if resume:
            done = completed_summary(run_dir)
            if done is not None:  # nothing to do: no rank group
                return RunResult(run_dir, done, None, already_completed=True)
            preflight(cfg, output_dir=False)  # here, before the ranks start
        restarts: list[str] = []
        out_dir, summary = supervise(
            rank_zero,
            (cfg, run_dir),
            resume=resume,
            restarts=restarts,
            limit=cfg.runtime.max_trainer_restarts,
            run_dir=run_dir,
            stop=stop or GracefulStop(),
            progress=progress,
            timeout_s=cfg.train.collective_timeout_s,
            retry=(RankGroupFailed,),
        )
        summary[RESTARTS] = len(restarts)
        return RunResult(Path(out_dir), summary, None)


def rank_zero(
    cfg: Config,
    run_dir: Path,
    resume: bool,
    restarts: list[str],
    *,
    stop: GracefulStop,
    progress: Progress | None,
) -> tuple[str, dict]:
    """Rank 0's process: start the group, train (the supervisor holds the lock), and
    return (run directory, summary). A rank group failure is raised as
    :class:`RankGroupFailed` naming the cause."""
    from streamrl.run.assembly import group_spec
    from streamrl.run.ranks import Ranks, collective_failure, start_local
    from streamrl.run.session import resolve_device, run_training

    ranks, group = Ranks(lead=None, restarts=restarts), None
    try:
        group, ranks.lead = start_local(
            group_spec(cfg, resolve_device(cfg.runtime.device)), run_dir
        )
        result = run_training(
            cfg, progress, run_dir=run_dir, resume=resume, stop=stop, lock=False, ranks=ranks
        )
        ranks.lead.release()
        group.close()
        return str(result.run_dir), result.summary
    except Exception as e:
        why = collective_failure(e, group.failure(wait_s=1.0) if group is not None else None)
        if why is None:
            raise
        raise RankGroupFailed(why) from None
    finally:  # (after a clean close: nothing left to do)
        if group is not None:
            group.close(grace_s=0)
