"""The rank group on Ray (``train.placement: ray``): every rank is an actor in one
placement group (``train.ray_strategy``); rank 0 is the trainer actor, which runs the
controller and publishes the weights; ranks 1..N-1 serve it
(:func:`~streamrl.engines.train.group.program.serve_rank`). The rendezvous address is
rank 0's node. Any rank's failure tears every actor and the placement group down, and
the group starts again from the latest checkpoint, up to ``runtime.max_trainer_restarts``
times (:mod:`streamrl.run.ranks`). A failure is: a rank's actor died (rank 0 included),
a follower's program raised, rank 0's collective failed, or a rank left a ping
unanswered for ``train.collective_timeout_s`` (hung, e.g. SIGSTOPped: a hung rank 0
between two commands fails no collective)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from streamrl.config import Config
from streamrl.core.atomic import write_text
from streamrl.engines.train.group.rendezvous import free_port, join, leave
from streamrl.engines.train.group.spec import GroupSpec, RankGroupFailed
from streamrl.run.assembly import group_spec
from streamrl.run.pings import Pings
from streamrl.run.ranks import RESTARTS, collective_failure
from streamrl.run.session import RunResult
from streamrl.run.signals import GracefulStop, Interrupted
from streamrl.run.supervisor import restart


def node_address() -> tuple[str, str, int]:
    """(this node's IP, its Ray node id, this process's id), in an actor."""
    import ray

    ip, node = ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()
    return ip, node, os.getpid()


class RankActor:
    """A follower rank on Ray."""

    def address(self) -> tuple[str, str, int]:
        return node_address()

    def ready(self) -> bool:
        """The ping (answered while ``serve`` runs: the actor takes two calls at a time)."""
        return True

    def serve(self, spec: GroupSpec, rank: int, addr: str, port: int) -> None:
        import torch

        from streamrl.engines.train.group.program import serve_rank

        torch.set_num_threads(spec.threads)
        join(spec, rank, addr, port)
        try:
            serve_rank(spec)
        finally:
            leave()


def rendezvous_point() -> tuple[str, int, str, int]:
    """Rank 0's side, in the trainer actor: (its node's IP, a free port there, its node
    id, its process id)."""
    ip, node, pid = node_address()
    return ip, free_port(ip), node, pid


class GroupActors:
    """One attempt's placement group and actors (rank 0 = ``trainer_cls``)."""

    def __init__(self, ray: Any, spec: GroupSpec, trainer_cls: Any, gpus: float) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.ray, self.spec = ray, spec
        bundle = {"CPU": float(spec.threads), **({"GPU": gpus} if gpus else {})}
        self.pg = placement_group([bundle] * spec.world_size, strategy=spec.ray_strategy)
        placed = [
            {"scheduling_strategy": PlacementGroupSchedulingStrategy(self.pg, r)}
            for r in range(spec.world_size)
        ]
        res = {"num_cpus": spec.threads, "num_gpus": gpus, "max_restarts": 0}
        trainer = ray.remote(**res, max_concurrency=2)(trainer_cls)
        follower = ray.remote(**res, max_concurrency=2)(RankActor)
        self.actors = [trainer.options(**placed[0]).remote()] + [
            follower.options(**p).remote() for p in placed[1:]
        ]

    def start(self, run_dir: Path, timeout: float) -> tuple[str, int]:
        """Wait for the placement, rendezvous at rank 0's node, start the followers;
        returns (address, port). Writes ``ranks.json``: each rank's node."""
        ray = self.ray
        try:
            ray.get(self.pg.ready(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"the rank group's placement group ({self.spec.world_size} bundles, "
                f"{self.spec.ray_strategy}) was not placed within {timeout:.0f}s; cluster "
                f"resources: {ray.available_resources()}"
            ) from None
        addr, port, node, pid = ray.get(self.actors[0].rendezvous.remote(), timeout=timeout)
        ranks = [(node, pid)] + [
            (n, p) for _, n, p in ray.get([a.address.remote() for a in self.actors[1:]])
        ]
        where = {"address": addr, "nodes": [n for n, _ in ranks], "pids": [p for _, p in ranks]}
        write_text(run_dir / "ranks.json", json.dumps(where) + "\n")
        self.serving = [
            a.serve.remote(self.spec, r, addr, port) for r, a in enumerate(self.actors) if r
        ]
        return addr, port

    def close(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for actor in self.actors:
            self.ray.kill(actor)
        remove_placement_group(self.pg)


def drive_group(
    ray: Any, cfg: Config, trainer_cls: Any, run_dir: Path, resume: bool, stop: GracefulStop
) -> RunResult:
    """Run the controller in rank 0's actor with its followers; restart the whole group
    from the latest checkpoint when a rank fails."""
    from streamrl.stream.pool import START_TIMEOUT_S

    spec, restarts = group_spec(cfg), []
    with stop:
        while True:
            group = GroupActors(ray, spec, trainer_cls, cfg.runtime.num_gpus)
            try:
                addr, port = group.start(run_dir, START_TIMEOUT_S)
                ref = group.actors[0].run.remote(
                    cfg, str(run_dir), resume, (spec, addr, port, list(restarts))
                )
                out_dir, summary = _await(ray, group, ref, stop)
                summary[RESTARTS] = summary["trainer_restarts"] = len(restarts)
                return RunResult(run_dir=Path(out_dir), summary=summary, trainer=None)
            except (*_rank_errors(ray), RankGroupFailed) as e:
                why = _why(ray, e)
                if why is None:
                    cause = e.as_instanceof_cause()
                    if isinstance(cause, Interrupted):
                        raise Interrupted(str(cause), stop.signum) from None
                    raise cause from None
                restart(cfg.runtime.max_trainer_restarts, restarts, run_dir, why)
                resume = True
            finally:
                group.close()


def _await(ray: Any, group: GroupActors, ref: Any, stop: GracefulStop) -> tuple[str, dict]:
    """Rank 0's result; any rank's failure raises at once (:class:`RankGroupFailed`, or
    Ray's error for a dead actor)."""
    waiting, forwarded = [ref, *group.serving], False
    pings = ray_pings(ray, group.actors, group.spec.collective_timeout_s)
    while True:
        done, waiting = ray.wait(waiting, num_returns=1, timeout=0.5)
        for finished in done:
            if finished is ref:
                return ray.get(ref)  # raises if rank 0 failed
            _follower_ended(ray, group.serving.index(finished) + 1, finished)
        pings.check()
        if stop.requested and not forwarded:
            group.actors[0].request_stop.remote(stop.signum)
            forwarded = True


def _follower_ended(ray: Any, rank: int, ref: Any) -> None:
    """A follower's program ended: fine if it returned (rank 0 released it); if it raised,
    whatever the error, the group failed (its actor's death raises Ray's own error)."""
    try:
        ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        raise RankGroupFailed(f"rank {rank} failed ({_raised(e)})") from None


def _raised(error: Any) -> str:
    """What a rank's call raised (its own exception, not Ray's wrapper and traceback)."""
    original = getattr(error, "cause", None)
    if not isinstance(original, BaseException):
        original = error.as_instanceof_cause()
    first = next((x for x in str(original).splitlines() if x.strip()), "")
    return f"{type(original).__name__}: {first.strip()[:300]}"


def ray_pings(ray: Any, actors: list[Any], timeout_s: float) -> Pings:
    """Ping each rank's actor (``ready``, answered while it runs another call) by the
    rules of :class:`~streamrl.run.pings.Pings`."""

    def pending(refs: list[Any]) -> list[int]:
        _, waiting = ray.wait(refs, num_returns=len(refs), timeout=0)
        return [r for r, ref in enumerate(refs) if ref in waiting]

    return Pings(lambda: [a.ready.remote() for a in actors], pending, timeout_s)


def _rank_errors(ray: Any) -> tuple[type[Exception], ...]:
    """How Ray reports a rank's failure: its actor or worker died (also when Ray's memory
    monitor killed it), or its call raised."""
    x = ray.exceptions
    return (x.RayActorError, x.OutOfMemoryError, x.WorkerCrashedError, x.RayTaskError)


def _why(ray: Any, error: Exception) -> str | None:
    """Why the group must restart (None: the run's own error, raised as it is)."""
    if isinstance(error, RankGroupFailed):
        return str(error)
    if not isinstance(error, ray.exceptions.RayTaskError):
        return f"a rank's actor died ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
    cause = error.as_instanceof_cause()
    if isinstance(cause, Interrupted) or collective_failure(cause, None) is None:
        return None
    return f"rank 0's collective failed ({_raised(error)})"
