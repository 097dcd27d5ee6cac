"""On-policy distillation (algorithm.advantage: distill): each token's advantage is
coef * (log p_teacher - log p_student) against hand-computed values, items routed to
their domain's teacher, no group dropped for equal rewards, the loss mode, the
tokenizer check, and real runs: a teacher equal to the student scores a reverse KL of 0."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from streamrl.algorithms.distill import Distill, Teachers
from streamrl.config import load_config
from streamrl.core.timing import StageTimer
from streamrl.core.types import Trajectory
from streamrl.models.loading import load_model_and_tokenizer
from streamrl.run.launch import train
from streamrl.stream.sample_stream import Group
from tests.tiny_run import algorithm_of, metric_rows


def _traj(behave: list[float], mask: list[bool], domain: str | None, index: int) -> Trajectory:
    n = len(mask)
    return Trajectory(
        input_ids=torch.arange(1, n + 1),
        loss_mask=torch.tensor(mask),
        behavior_logprobs=torch.tensor(behave),
        versions=torch.zeros(n, dtype=torch.long),
        reward=1.0,
        item_index=index,
        metadata={} if domain is None else {"domain": domain},
    )


class TeacherTrainer:
    """compute_logprobs(batch, model): each stand-in teacher gives every token its constant."""

    def compute_logprobs(self, batch, model=None):
        return torch.full(batch.input_ids.shape, float(model))


def _distill(*overrides: str) -> Distill:
    cfg = load_config(
        None,
        [
            "algorithm.name=distill",
            "algorithm.distill.teacher=tiny",
            "algorithm.distill.teachers={math: tiny-small}",
            *overrides,
        ],
    )
    algo = algorithm_of(cfg)
    assert isinstance(algo, Distill)
    algo.teachers.models = {"tiny": -1.0, "tiny-small": -0.25}  # stand-ins
    return algo


def _groups() -> list[Group]:
    math = _traj([0.0, -0.5, -2.0, -1.0], [False, True, True, False], "math", 0)
    other = _traj([0.0, -0.5, -2.0, -1.0], [False, True, True, True], "code", 1)
    # every reward equal: dynamic sampling would drop these groups; distillation keeps them
    return [Group(0, 0, [math]), Group(1, 0, [other])]


def test_each_tokens_advantage_is_coef_times_teacher_minus_student_by_domain() -> None:
    algo = _distill("algorithm.distill.coef=2.0")
    groups = _groups()
    kept = [algo.finish_group(g.trajectories, {}) for g in groups]
    assert [len(k) for k in kept] == [1, 1]
    batch = algo.prepare(groups, TeacherTrainer(), StageTimer())
    # row 0 (math): teacher -0.25; row 1 (code, not listed): the default teacher -1.0
    expected = torch.tensor(
        [
            [0.0, 2 * (-0.25 + 0.5), 2 * (-0.25 + 2.0), 0.0],
            [0.0, 2 * (-1.0 + 0.5), 2 * (-1.0 + 2.0), 2 * (-1.0 + 1.0)],
        ]
    )
    assert torch.allclose(batch.advantages, expected)
    assert batch.ref_logprobs is None
    # the loss reports the mean reverse KL of the trained tokens: -(sum of A) / coef / 5
    logprobs = batch.behavior_logprobs.clone().requires_grad_(True)
    _, metrics = algo.loss_fn({"logprobs": logprobs}, batch)
    assert metrics["distill/reverse_kl"] == pytest.approx(-float(expected.sum()) / 2 / 5)


def test_loss_mode_puts_the_teacher_in_the_kl_term_and_zero_advantages() -> None:
    algo = _distill("algorithm.distill.mode=loss", "algorithm.distill.coef=0.5")
    batch = algo.prepare(_groups(), TeacherTrainer(), StageTimer())
    assert torch.equal(batch.advantages, torch.zeros(2, 4))
    assert torch.equal(batch.ref_logprobs[0], torch.full((4,), -0.25))
    assert torch.equal(batch.ref_logprobs[1], torch.full((4,), -1.0))
    assert algo.loss_fn.kl_coef == 0.5
    with pytest.raises(ValueError, match="algorithm.kl.coef"):
        _distill("algorithm.distill.mode=loss", "algorithm.kl.coef=0.1")


def test_an_item_of_no_teacher_is_an_error_naming_the_domain() -> None:
    cfg = load_config(
        None,
        [
            "algorithm.name=distill",
            "algorithm.distill.teacher=null",
            "algorithm.distill.teachers={math: m}",
        ],
    )
    teachers = Teachers(cfg.algorithm.distill)
    assert teachers.names() == ["m"]
    with pytest.raises(ValueError, match="no teacher for domain 'code'"):
        teachers.name_for(_traj([0.0], [True], "code", 0))


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.distill.teacher=runs/none/model"],
        ["algorithm.distill.teacher=tiny", "algorithm.distill.teachers={math: no/such/dir}"],
    ],
)
def test_a_missing_teacher_fails_when_the_algorithm_is_built(overrides) -> None:
    cfg = load_config(None, ["algorithm.name=distill", *overrides])
    with pytest.raises(FileNotFoundError, match="algorithm.distill: teacher"):
        algorithm_of(cfg)


def test_a_teacher_of_another_vocabulary_is_refused() -> None:
    cfg = load_config(None, ["algorithm.name=distill", "algorithm.distill.teacher=tiny-small"])
    with pytest.raises(ValueError, match="share the student's tokenizer"):
        Teachers(cfg.algorithm.distill).load(vocab_size=7, device="cpu")


@pytest.mark.slow
def test_a_teacher_identical_to_the_student_gives_a_reverse_kl_of_zero(
    tmp_path: Path, tiny_config
) -> None:
    """A real run whose teacher is the student's own starting weights (a saved checkpoint
    of the same preset and seed): the engine's sampled log-probs and the teacher's scores
    of the same tokens agree, so the first step's reverse KL is 0; a teacher of other
    weights gives a positive one."""
    model, tokenizer = load_model_and_tokenizer("tiny-small", seed=0)
    model.save_pretrained(tmp_path / "self")
    tokenizer.save_pretrained(tmp_path / "self")
    kl = {}
    for name, teacher in (("self", tmp_path / "self"), ("other", "tiny")):
        cfg = tiny_config(
            "seed=0",
            "algorithm.name=distill",
            f"algorithm.distill.teacher={teacher}",
            "train.steps=1",
            "train.items_per_step=4",
            "rollout.group_size=2",
            "rollout.max_new_tokens=6",
            output_dir=tmp_path / name,
        )
        train(cfg)
        rows = metric_rows(tmp_path / name / cfg.run.name)
        kl[name] = [r["distill/reverse_kl"] for r in rows if "distill/reverse_kl" in r]
    assert len(kl["self"]) == 1 and abs(kl["self"][0]) < 1e-5, kl
    assert kl["other"][0] > 1e-3, kl
