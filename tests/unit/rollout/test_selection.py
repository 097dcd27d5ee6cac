"""Difficulty-aware prompt selection: the Beta-Bernoulli posterior against hand-computed
values, the skip decision, the stream's books with skips (a skipped item is never
issued), the selector's checkpoint round-trip, and bad config values."""

from __future__ import annotations

import itertools
import json
import threading
import time
from fractions import Fraction
from pathlib import Path

import pytest

from streamrl.config import ConfigError, load_config
from streamrl.core.messages import GroupDone, GroupRejected, StartItems, VersionReport
from streamrl.core.types import Item
from streamrl.rollout.selection.posterior import (
    PosteriorSampler,
    PromptSelector,
    all_equal_probability,
)
from streamrl.run.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from streamrl.run.preflight import PreflightError, check_selection
from streamrl.run.session import run_training
from streamrl.stream.backends import RolloutPool
from streamrl.stream.backends.base import Backend
from streamrl.stream.sample_stream import SampleStream

# ------------------------------------------------------------------ the posterior


def test_all_equal_probability_matches_the_beta_function_formula() -> None:
    # Beta(3, 2), G = 4: B(7,2)/B(3,2) = 3/5*4/6*5/7*6/8 = 3/14; B(3,6)/B(3,2) = 1/14
    assert all_equal_probability(Fraction(3), Fraction(2), 4) == Fraction(2, 7)
    # the uniform prior: E[p^G + (1-p)^G] = 2/(G+1)
    for g in (1, 2, 4, 8):
        assert all_equal_probability(Fraction(1), Fraction(1), g) == Fraction(2, g + 1)
    assert all_equal_probability(3.0, 2.0, 4) == pytest.approx(2 / 7, abs=1e-15)


def test_a_group_updates_the_posterior_once_it_has_ended() -> None:
    sel = PromptSelector(group_size=4)
    sel.observe(0, "q", [1.0, 1.0, 0.0])  # successes [1, 1, 0]
    sel.advance(1, outstanding={0})  # still outstanding (ready, not consumed): waits
    assert sel.posterior("q") == (1.0, 1.0)
    sel.observe(0, "q", [1.0, 1.0, 0.0])  # a re-issued item reports again: counted once
    sel.advance(2, outstanding=set())
    assert sel.posterior("q") == (3.0, 2.0)  # Beta(1, 1) + 2 successes, 1 failure
    assert sel.p_all_equal("q") == pytest.approx(2 / 7, abs=1e-15)
    sel.observe(1, "q", [0.2, 0.9])  # reward > success_threshold (0.5) is a success
    sel.advance(3, outstanding=set())
    assert sel.posterior("q") == (4.0, 3.0)
    assert sel.metrics()["selection/groups_observed"] == 2
    sel.observe(2, "r", [])  # a failed item (nothing scored) is no evidence
    sel.advance(4, outstanding=set())
    assert sel.posterior("r") == (1.0, 1.0) and sel.metrics()["selection/prompts"] == 1


def test_old_evidence_decays_toward_the_prior() -> None:
    sel = PromptSelector(group_size=4, prior_alpha=2.0, prior_beta=1.0, decay=0.5)
    sel.observe(0, "q", [1.0, 1.0, 1.0, 0.0])
    sel.advance(1, outstanding=set())
    assert sel.posterior("q") == (5.0, 2.0)
    sel.advance(3, outstanding=set())  # two versions later the evidence weighs 1/4
    assert sel.posterior("q") == (2.75, 1.25)
    sel.observe(1, "q", [1.0, 1.0, 1.0, 1.0])  # 3 * 0.25 + 4 successes, 1 * 0.25 failures
    sel.advance(3, outstanding=set())
    assert sel.posterior("q") == (6.75, 1.25)


# ------------------------------------------------------------------ the decision


def _item(key: str) -> Item:
    return Item(id=key, prompt=key, answer="")


def test_skip_decision_and_its_counters() -> None:
    sel = PromptSelector(group_size=4, threshold=0.5, max_skips_in_a_row=2)
    sel.observe(0, "easy", [1.0] * 4)  # Beta(5, 1): P = 5/9 + 1/126 = 71/126 > 0.5
    sel.observe(1, "mixed", [1.0, 1.0, 0.0, 0.0])  # Beta(3, 3): P = 5/21
    sel.advance(1, outstanding=set())
    assert all_equal_probability(Fraction(5), Fraction(1), 4) == Fraction(71, 126)
    assert all_equal_probability(Fraction(3), Fraction(3), 4) == Fraction(5, 21)
    assert sel.accept(_item("fresh"))  # never seen: always tried (prior P = 2/5)
    assert sel.accept(_item("mixed"))
    assert not sel.accept(_item("easy"))
    assert not sel.accept(_item("easy"))
    assert sel.accept(_item("easy"))  # the third skip in a row would exceed 2: forced
    assert not sel.accept(_item("easy"))
    m = sel.metrics()
    assert m["selection/skipped"] == 3 and m["selection/forced"] == 1
    assert m["selection/issued"] == 3
    assert m["selection/predicted_all_equal"] == pytest.approx(2 / 5 + 5 / 21 + 71 / 126)


def test_checkpoint_round_trip_of_the_selector(tmp_path: Path) -> None:
    sel = PromptSelector(group_size=4, decay=0.9)
    sel.observe(0, "easy", [1.0] * 4)
    sel.advance(1, outstanding=set())
    sel.accept(_item("easy"))
    sel.observe(1, "a", [0.0] * 4)  # ended (rejected) but not yet taken in
    sel.observe(2, "b", [1.0, 0.0, 0.0, 0.0])  # outstanding: issued again after a resume
    state = {"pool": {"selection": sel.state_dict(outstanding={2})}}
    save_checkpoint(tmp_path, Checkpoint("rl", 1, {}, {}, state), keep=1)
    loaded = load_checkpoint(tmp_path / "checkpoints" / "rl-000001").state["pool"]["selection"]
    back = PromptSelector(group_size=4, decay=0.9)
    back.load_state_dict(loaded)
    assert back.metrics() == sel.metrics()
    for s in (sel, back):  # both continue the same way (item 2 is re-issued and reports)
        s.observe(2, "b", [1.0, 0.0, 0.0, 0.0])
        s.advance(3, outstanding=set())
    for key in ("easy", "a", "b"):
        assert back.posterior(key) == sel.posterior(key)
    assert back.posterior("easy") == (1 + 4 * 0.9**2, 1.0)


# ------------------------------------------------------------------ the pool's books


class ScriptedBackend(Backend):
    """One worker that reports each item at once: 'easy*' items all correct (filtered as
    zero variance), the others half correct (consumed)."""

    name, num_workers, restartable = "scripted", 1, False

    def __init__(self) -> None:
        self.reports: list = []
        self.version = 0
        self.lock = threading.Lock()
        self.started: list[str] = []

    def start(self) -> None:
        self.reports.append((0, VersionReport(0)))

    def send(self, worker: int, command) -> None:
        if not isinstance(command, StartItems):
            return
        with self.lock:
            for it in command.items:
                self.started.append(it.id)
                self.reports.append((0, self.report(it)))

    def report(self, it: Item) -> GroupDone | GroupRejected:
        if it.id.startswith("easy"):
            return GroupRejected(it.index, "filtered", "zero_reward_std", rewards=(1.0,) * 4)
        return GroupDone(it.index, (), 2.0, 4, rewards=(1.0, 1.0, 0.0, 0.0))

    def poll(self):
        with self.lock:
            out, self.reports = self.reports, []
            return out

    def dead(self):
        return {}

    def restart(self, worker: int) -> None:
        raise AssertionError("never restarted")

    def publish(self, state_dict, version: int) -> None:
        with self.lock:
            self.reports.append((0, VersionReport(version)))

    def close(self) -> None:
        pass


def _keys():
    for n in itertools.count():  # 2 easy prompts and 2 mixed ones, cycled
        yield _item(["easy0", "mixed0", "easy1", "mixed1"][n % 4])


def test_skipped_items_are_never_issued_and_the_books_balance() -> None:
    stream = SampleStream(items_per_batch=2, max_staleness=0)
    backend = ScriptedBackend()
    pool = RolloutPool(backend, stream, _keys(), sampler=PosteriorSampler(PromptSelector(4)))
    pool.start()
    try:
        for step in range(1, 7):
            deadline = time.monotonic() + 60
            while (groups := stream.get_batch(timeout=0.05)) is None:
                pool.raise_if_failed()
                assert time.monotonic() < deadline, "no batch"
            assert len(groups) == 2
            pool.publish({}, step)
            stream.set_trainer_version(step)
    finally:
        pool.stop()
    stream.close()
    stream.check_accounting()
    s, m = stream.stats, pool.sampler.metrics()
    assert s.issued == s.consumed + sum(s.filtered.values()) + sum(s.failed.values())
    assert s.consumed == 12 and m["selection/issued"] == s.issued
    # each easy prompt is generated once (all correct), then skipped for good
    assert backend.started.count("easy0") == backend.started.count("easy1") == 1
    assert s.filtered["zero_reward_std"] == 2 and m["selection/skipped"] >= 10
    assert pool.drawn == s.issued + m["selection/skipped"]  # the source's position
    # the checkpoint carries the selector; a new pool continues from it
    state, _ = pool.checkpoint()
    sampler = PosteriorSampler(PromptSelector(group_size=4))
    fresh = RolloutPool(ScriptedBackend(), SampleStream(2, 0), _keys(), sampler=sampler)
    fresh.restore(state)
    assert fresh.sampler.metrics() == m
    assert not sampler.selector.accept(_item("easy0"))


# ------------------------------------------------------------------ a short run, and bad input


# 4 SFT steps, then 6 RL steps of 4 items
SHORT_RUN = [
    "sft.steps=4",
    "sft.examples_per_step=8",
    "data.options={digits: 1, operators: '+', heldout_size: 8}",
    "rollout.group_size=4",
    "rollout.max_new_tokens=4",
    "train.items_per_step=4",
    "train.steps=6",
]


@pytest.mark.slow
def test_a_short_run_with_selection_keeps_the_books(tmp_path: Path, tiny_config) -> None:
    cfg = tiny_config(*SHORT_RUN, "selection.kind=posterior", "run.name=sel")
    summary = run_training(cfg).summary
    ended = summary["stream/consumed"] + summary["stream/filtered"] + summary["stream/failed"]
    assert summary["stream/issued"] == ended == summary["selection/issued"]
    assert summary["stream/consumed"] == 24
    assert summary["selection/skipped"] > 0  # a 1-digit problem repeats within 6 steps
    rows = [json.loads(x) for x in (tmp_path / "sel" / "ledger.jsonl").read_text().splitlines()]
    indices = [i for r in rows for i in r["consumed"]]
    indices += [
        i for r in rows for o in ("filtered", "failed") for v in r.get(o, {}).values() for i in v
    ]
    assert sorted(indices) == list(range(summary["stream/issued"]))  # skips took no index
    metrics = [json.loads(x) for x in (tmp_path / "sel" / "metrics.jsonl").read_text().splitlines()]
    assert "selection/skipped" in metrics[-1]


def test_bad_selection_values_name_the_key(tmp_path: Path) -> None:
    for bad in ("selection.threshold=1.5", "selection.threshold=-0.1"):
        with pytest.raises(ConfigError, match=r"selection\.threshold: Input should be"):
            load_config(None, [bad])
    # a kind no sampler is registered under: one line naming the key and the known kinds
    with pytest.raises(PreflightError, match=r"selection\.kind: unknown kind 'thompson'; known"):
        check_selection(load_config(None, ["selection.kind=thompson"]))
    with pytest.raises(ConfigError, match=r"selection\.prior_alpha"):
        load_config(None, ["selection.prior_alpha=0"])
    # below the prior's own P(all equal) (2/9 for Beta(1, 1), G = 8), nothing could return
    cfg = load_config(None, ["selection.kind=posterior", "selection.threshold=0.2"])
    with pytest.raises(PreflightError, match=r"selection\.threshold=0\.2 must be above 0\.2222"):
        check_selection(cfg)
    check_selection(load_config(None, ["selection.kind=posterior"]))


def test_the_books_report_the_mean_reward_of_the_groups_dropped_for_equal_rewards() -> None:
    """What selection could save: of the groups dynamic sampling dropped, the mean reward
    (0/1 rewards: the share that were all correct), over the whole run; other filtered or
    failed groups and consumed ones do not count."""
    from streamrl.stream.books import PoolBooks

    books = PoolBooks()

    def dropped(rewards: tuple[float, ...], reason: str = "zero_reward_std") -> GroupRejected:
        return GroupRejected(0, "filtered", reason, "", sum(rewards), len(rewards), {}, rewards)

    books._add_rollout_stats(dropped((1.0,) * 4))
    books._add_rollout_stats(dropped((0.0,) * 4))
    books._add_rollout_stats(dropped((1.0,) * 4))
    books._add_rollout_stats(dropped((0.0, 1.0), reason="episode_rejected"))
    books._add_rollout_stats(GroupDone(1, (), 3.0, 4, {}, (1.0, 1.0, 1.0, 0.0)))
    first = books.pop_rollout_stats()
    assert first["rollout/equal_reward_groups_reward_mean"] == pytest.approx(2 / 3)
    assert first["rollout/reward_mean"] == pytest.approx(12 / 18)
    books._add_rollout_stats(dropped((0.5,) * 2))  # cumulative: (1 + 0 + 1 + 0.5) / 4
    assert books.pop_rollout_stats()["rollout/equal_reward_groups_reward_mean"] == 0.625
    assert PoolBooks().pop_rollout_stats() == {}
