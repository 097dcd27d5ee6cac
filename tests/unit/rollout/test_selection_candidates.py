"""The likelihood gate's candidates: each issued item gets several, scored together; the
first accepted one is generated, later accepted ones go back to the pool as spares and
are issued again, nothing drawn is lost, and the bundle size follows the skip rate of
fresh candidates (by hand). The gate's own prediction is tested in
test_selection_likelihood.py."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
import torch

from streamrl.config import load_config
from streamrl.core.messages import GroupDone, GroupRejected, SamplerWork, StartItems, VersionReport
from streamrl.core.types import Item, SamplingParams, Trajectory
from streamrl.rollout.selection.candidates import CandidateBudget, candidates_for
from streamrl.rollout.selection.gate import LikelihoodGate
from streamrl.rollout.selection.likelihood import LikelihoodSampler, ScoreAhead
from streamrl.rollout.worker import RolloutWorker
from streamrl.stream.backends import RolloutPool
from streamrl.stream.sample_stream import SampleStream
from tests.tiny_run import algorithm_of
from tests.unit.rollout.test_selection import ScriptedBackend


class ScriptedGate(LikelihoodGate):
    """p_hat by the item's id: 'e...' certainly right (skipped as all-correct at G = 4),
    'w...' certainly wrong (skipped with skip_all_wrong), 'x...' fails to score, the rest
    (mixed) never right."""

    def __init__(self) -> None:
        super().__init__(None, SamplingParams(temperature=1.0), 4, 0.5, skip_all_wrong=False)
        self.scored: list[str] = []

    async def p_reference(self, engine, item: Item) -> float | None:
        self.scored.append(item.id)
        if item.id.startswith("x"):
            raise RuntimeError(f"cannot score {item.id}")
        return 1.0 if item.id.startswith("e") else 0.0


def _items(*ids: str) -> list[Item]:
    return [Item(id=i, prompt=f"{i}=", answer="1") for i in ids]


def _candidates(cmd: StartItems) -> list[list[Item]]:
    """Each item's candidates, the item first (its plan's alternates after it)."""
    return [[item, *(plan.alternates if plan else ())] for item, plan in cmd.planned()]


def _ungated(cmd: StartItems) -> set[int]:
    """The items to generate without the gate: forced, or decided ahead."""
    return {item.index for item, plan in cmd.planned() if plan is not None and not plan.gated}


def _spares(reports: list) -> list[Item]:
    """The candidates the worker handed back in its reports."""
    ended = [r for _, r in reports if isinstance(r, GroupDone | GroupRejected) and r.feedback]
    return [it for r in ended for it in r.feedback.spares]


def test_the_first_accepted_candidate_is_chosen_and_later_accepted_ones_are_spares() -> None:
    gate = ScriptedGate()
    choice = asyncio.run(gate.choose(None, 7, _items("e0", "e1", "m2", "e3", "m4", "x5")))
    assert choice.item is not None and (choice.item.id, choice.item.index) == ("m2", 7)
    assert choice.outcomes == [
        "predicted_all_correct",
        "predicted_all_correct",
        "chosen",
        "predicted_all_correct",  # skipped after the choice: dropped, and counted
        "spare",
        "spare",  # a scoring failure after the choice is scored again later, not lost
    ]
    assert [c.id for c in choice.spares] == ["m4", "x5"] and choice.error is None
    assert gate.scored == ["e0", "e1", "m2", "e3", "m4", "x5"]
    # a failure before any accepted candidate ends the item, recorded; the rest go back
    choice = asyncio.run(gate.choose(None, 8, _items("e0", "x1", "m2", "e3")))
    assert choice.item is None and "cannot score x1" in str(choice.error)
    assert choice.outcomes == ["predicted_all_correct", "failed", "spare", "predicted_all_correct"]
    assert [c.id for c in choice.spares] == ["m2"]
    # every candidate skipped: the item is filtered for the last one's reason
    gate.skip_all_wrong = True
    gate.p_reference = lambda engine, item: _const(0.0 if item.id.startswith("w") else 1.0)
    choice = asyncio.run(gate.choose(None, 9, _items("e0", "w1")))
    assert choice.item is None and choice.error is None and not choice.spares
    assert choice.reason == "predicted_all_wrong"
    assert choice.detail == "all 2 candidates skipped; the last: predicted P(all 4 wrong) <= 1.0000"


async def _const(p: float) -> float:
    return p


def test_the_bundle_size_follows_the_skip_rate_of_fresh_candidates() -> None:
    # the least k with rate^k <= 0.1: 0.5^4 = 0.0625 (0.5^3 = 0.125), 0.75^9 = 0.075
    assert [candidates_for(r, 64) for r in (0.05, 0.5, 0.75, 0.99)] == [1, 4, 9, 64]
    assert candidates_for(0.99, 16) == 16
    budget = CandidateBudget(max_candidates=16)
    budget.observe(["predicted_all_correct", "predicted_all_correct", "chosen", "spare"])
    budget.observe(["chosen"], respared=1)  # a spare again: not fresh
    budget.observe(["predicted_all_correct"], respared=1)  # a spare, now skipped
    budget.observe(["predicted_all_wrong", "failed"])
    assert (budget.size, budget.skip_rate) == (1, 0.0)  # moves only at a publish
    budget.advance()  # fresh: 6 scored, 3 skipped
    assert (budget.skip_rate, budget.size) == (0.5, 4)
    budget.advance()  # nothing scored since: unchanged
    assert (budget.skip_rate, budget.size) == (0.5, 4)
    m = budget.metrics()
    assert m["selection/scored"] == 8 and m["selection/skipped"] == 4
    assert m["selection/skipped/predicted_all_correct"] == 3
    assert m["selection/skipped/predicted_all_wrong"] == 1
    assert m["selection/spares"] == 1 and m["selection/spares_reskipped"] == 1
    again = CandidateBudget(max_candidates=16)
    again.load_state_dict(budget.state_dict())
    assert again.metrics() == m
    with pytest.raises(ValueError, match="max_candidates"):
        CandidateBudget(0)


class GateBackend(ScriptedBackend):
    """One worker, the real ``RolloutWorker`` (gate, choice, reports), that rolls each
    item out at once; its groups are mixed, so every generated item is consumed."""

    name = "gate"

    def __init__(self) -> None:
        super().__init__()
        self.gate = ScriptedGate()
        algorithm = algorithm_of(load_config(None, []))
        self.engine = type("Engine", (), {"version": 0})()  # the weight version, nothing else
        self.worker = RolloutWorker(
            self.engine,
            self.episode,
            algorithm,
            self.emit,
            group_size=4,
            seed=0,
            sampler=LikelihoodSampler(self.gate),
        )
        self.commands: list[StartItems] = []
        self.ahead: list[ScoreAhead] = []
        self.generated: list[Item] = []
        self.sent: list = []  # every report
        self.samples = 0

    def emit(self, report) -> None:
        self.reports.append((0, report))
        self.sent.append((0, report))

    async def episode(self, engine, item: Item, seed: int, greedy: bool = False) -> Trajectory:
        if not self.generated or self.generated[-1] is not item:  # a group's first sample
            self.generated.append(item)
        self.samples += 1
        one = torch.ones(1)
        reward = float(self.samples % 2)  # half the samples right: a mixed group
        return Trajectory(one.long(), one.bool(), one * 0, one.long() * 0, reward, item.index)

    def send(self, worker: int, command) -> None:
        with self.lock:
            if isinstance(command, SamplerWork):
                self.ahead.append(command.payload)
                asyncio.run(self.worker._work(command))
            if not isinstance(command, StartItems):
                return
            self.commands.append(command)
            for group in self.worker.groups(command):
                asyncio.run(group)

    def publish(self, state_dict, version: int) -> None:
        with self.lock:
            self.engine.version = version
            self.reports.append((0, VersionReport(version)))


def _source():
    for n in itertools.count():  # three easy prompts, then a mixed one; ids in draw order
        yield Item(id=f"{'m' if n % 4 == 3 else 'e'}{n:04d}", prompt=f"{n}=", answer="1")


def _run(
    steps: int, source=None, budget=None, eta: int = 0, ahead: int = 0, train_s: float = 0.0
) -> tuple[RolloutPool, GateBackend, SampleStream]:
    stream = SampleStream(items_per_batch=2, max_staleness=eta)
    backend = GateBackend()
    budget = budget or CandidateBudget(64)
    sampler = LikelihoodSampler(budget=budget, score_ahead=ahead)
    pool = RolloutPool(backend, stream, source or _source(), sampler=sampler)
    pool.start()
    try:
        for step in range(1, steps + 1):
            deadline = time.monotonic() + 60
            while (groups := stream.get_batch(timeout=0.05)) is None:
                pool.raise_if_failed()
                assert time.monotonic() < deadline, "no batch"
            assert len(groups) == 2
            time.sleep(train_s)  # a trainer slower than generation: the worker idles
            if step < steps:  # no publish after the last batch: nothing is outstanding
                pool.publish({}, step)
                stream.set_trainer_version(step)
    finally:
        pool.stop()
    return pool, backend, stream


def test_the_pool_issues_bundles_reissues_spares_and_loses_nothing() -> None:
    pool, backend, stream = _run(steps=6)
    stream.close()
    stream.check_accounting()
    s, m = stream.stats, pool.sampler.metrics()
    assert s.consumed == 12 and s.issued == s.consumed + sum(s.filtered.values())
    generated = [it.id for it in backend.generated]
    assert all(i.startswith("m") for i in generated) and len(set(generated)) == len(generated)
    # version 0: one candidate per item, 6 of the 8 skipped; then ~9 per fresh item
    # (3 in 4 fresh draws are skipped: 0.75^9 <= 0.1), a spare alone
    assert not backend.commands[0].plans
    assert m["selection/candidates"] == candidates_for(m["selection/skip_rate"], 64)
    sizes = {len(c) for cmd in backend.commands for c in _candidates(cmd)}
    assert 1 in sizes and min(sizes - {1}) >= 8 and max(sizes) <= 11
    # nothing drawn is lost: every mixed item drawn is generated or still a spare
    state, _ = pool.checkpoint()
    pending = [it.id for it in state["selection"]["spares"]]
    drawn = [it.id for it in itertools.islice(_source(), pool.drawn)]
    assert sorted(generated + pending) == sorted(i for i in drawn if i.startswith("m"))
    assert m["selection/skipped"] == sum(i.startswith("e") for i in drawn)
    assert m["selection/spares"] > 0 and m["selection/spares_reskipped"] == 0
    assert m["selection/scored"] == len(backend.gate.scored)
    # a spare is issued again (alone) before any fresh draw, in item order
    handed_back = {it.id for it in _spares(backend.sent)}
    firsts = [c[0] for cmd in backend.commands for c in _candidates(cmd)]
    respared = [it.id for it in firsts if it.id in handed_back]
    assert respared and respared == sorted(respared)
    assert all(
        len(c) == 1 for cmd in backend.commands for c in _candidates(cmd) if c[0].id in handed_back
    )
    # the checkpoint carries the budget, the spares and the bundles; a new pool goes on
    fresh = RolloutPool(GateBackend(), SampleStream(2, 0), _source(), sampler=LikelihoodSampler())
    fresh.restore(state)
    assert fresh.sampler.metrics() == m
    assert pending and [fresh.sampler.issue(i).id for i in range(len(pending))] == pending


def test_eta0_pools_issue_the_same_bundles() -> None:
    a, b = _run(steps=4)[1], _run(steps=4)[1]
    assert a.commands == b.commands and a.gate.scored == b.gate.scored


def test_a_gate_that_skips_everything_cannot_stall_the_run() -> None:
    """Every candidate is predicted all-correct: after selection.max_skips_in_a_row skips
    the next item is generated without the gate (selection/forced), so batches still come."""
    easy = (Item(id=f"e{n:04d}", prompt=f"{n}=", answer="1") for n in itertools.count())
    pool, backend, stream = _run(3, easy, CandidateBudget(8, max_skips_in_a_row=10))
    stream.close()
    stream.check_accounting()
    m = pool.sampler.metrics()
    assert stream.stats.consumed == 6 and m["selection/forced"] >= 6
    assert m["selection/skipped"] >= 10 * m["selection/forced"]
    forced = [
        c for cmd in backend.commands for c in _candidates(cmd) if c[0].index in _ungated(cmd)
    ]
    assert all(len(c) == 1 for c in forced)  # generated as drawn, no alternates
    assert {it.id for it in backend.generated} <= {c[0].id for c in forced}


def test_an_idle_worker_scores_ahead_and_those_decisions_are_issued_unscored() -> None:
    """At η = 1 the worker is idle whenever the stream is full: it scores fresh candidates
    ahead (selection.score_ahead), and scores the held ones again once enough are held;
    the accepted ones are issued first, alone, generated without scoring again, and
    nothing drawn is lost."""
    pool, backend, stream = _run(steps=8, eta=1, ahead=2, train_s=0.05)
    pool._receive(backend.poll())  # the reports sent after the last step (inline backend)
    assert 0 not in pool.sampler._scoring and not pool.inflight[0]
    stream.close()
    stream.check_accounting()
    m = pool.sampler.metrics()
    assert backend.ahead and m["selection/ahead/issued"] > 0
    # fresh draws, and once enough are held, the held ones again at newer weights
    ahead = [it.id for c in backend.ahead for it in c.items]
    assert m["selection/ahead/scored"] + m["selection/ahead/rescored"] == len(ahead)
    assert m["selection/ahead/rescored"] > 0 and m["selection/ahead/reskipped"] == 0
    assert m["selection/scored"] == len(backend.gate.scored)
    scored_ahead = set(ahead)
    starts = [(c, cmd) for cmd in backend.commands for c in _candidates(cmd)]
    ungated = [c for c, cmd in starts if c[0].index in _ungated(cmd)]
    assert m["selection/forced"] == 0 and len(ungated) == m["selection/ahead/issued"]
    # accepted ahead ('m' ids only), generated as they are: alone, not scored again
    issued_ahead = [c[0].id for c in ungated]
    assert all(i in scored_ahead and i.startswith("m") for i in issued_ahead)
    assert all(len(c) == 1 for c in ungated)
    assert all(backend.gate.scored.count(i) == ahead.count(i) for i in issued_ahead)
    generated = [it.id for it in backend.generated]
    assert set(issued_ahead) <= set(generated) and len(set(generated)) == len(generated)
    # nothing drawn is lost: every mixed item drawn is generated or held (ahead or spare)
    state, _ = pool.checkpoint()
    pending = [it.id for it in state["selection"]["spares"]]
    drawn = [it.id for it in itertools.islice(_source(), pool.drawn)]
    assert sorted(generated + pending) == sorted(i for i in drawn if i.startswith("m"))
    assert m["selection/skipped"] == sum(i.startswith("e") for i in drawn)


def test_decisions_made_ahead_expire_and_a_lost_workers_batch_is_kept() -> None:
    stream = SampleStream(items_per_batch=2, max_staleness=1)
    budget = CandidateBudget(64)
    sampler = LikelihoodSampler(budget=budget, score_ahead=3)
    pool = RolloutPool(GateBackend(), stream, _source(), sampler=sampler)
    old, recent, scoring = _items("m1", "m2", "m3")
    sampler._ahead.extend([(old, 1), (recent, 2)])
    sampler.published(5, set())  # decisions older than version 5 - 3 are scored again
    sampler.catch_up()
    assert [it for it, _ in sampler._ahead] == [recent] and list(sampler._spares) == [old]
    assert sampler.metrics()["selection/ahead/expired"] == 1
    sampler._scoring[0] = (7, (scoring,), True)  # a batch out when its worker is lost
    pool.backend.restartable, pool.backend.restart = True, lambda w: None
    pool._replace(0, "test")
    assert list(sampler._spares) == [old, scoring] and 0 not in sampler._scoring
    pool.versions[0] = 0
    assert len(stream.admit(0, 4)) == 4  # the stream is full: the worker is idle
    pool.work_ahead(False)  # the trainer evaluates: no scoring ahead meanwhile
    assert not pool._dispatch() and 0 not in sampler._scoring
    pool.work_ahead(True)
    assert pool._dispatch() and len(sampler._scoring[0][1]) == 3 * 2 - 1  # 1 held already
    at_eta0 = LikelihoodSampler(budget=budget, score_ahead=3)
    RolloutPool(GateBackend(), SampleStream(2, 0), _source(), sampler=at_eta0)
    assert at_eta0.score_ahead == 0  # η = 0: off
