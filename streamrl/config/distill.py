"""The ``algorithm.distill`` section: on-policy distillation (``algorithm.name:
distill``). The student samples; a frozen teacher scores the student's tokens; the
per-token reverse KL between them is the advantage (or the loss). The algorithm itself is
:mod:`streamrl.algorithms.distill`; it reads this section only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from streamrl.config.base import Section


class DistillConfig(Section):
    """Which teacher scores which item, and how its log-probs become the training signal."""

    teacher: str | None = Field(
        "runs/default/model",
        description="The teacher of every item no entry of `teachers` claims: a preset, "
        "'smollm2-135m-instruct', or a checkpoint directory (default: the main job's "
        "trained model). It must share the student's tokenizer. None: every item's domain "
        "must be in `teachers`.",
    )
    teachers: dict[str, str] = Field(
        default_factory=dict,
        description="Teachers by domain: {domain: model}. A mixture source "
        "(data.kind: mixture) tags each item with its source's name; the item is scored by "
        "that domain's teacher.",
    )
    mode: Literal["advantage", "loss"] = Field(
        "advantage",
        description="advantage: token t's advantage is coef * (log p_teacher - log "
        "p_student) of the sampled token, trained with algorithm.policy_loss; loss: that "
        "reverse KL is a penalty in the loss (estimator algorithm.kl.kind), the advantages 0.",
    )
    coef: float = Field(1.0, gt=0, description="Weight of the reverse KL.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="The teachers' weights' dtype."
    )

    @field_validator("teachers")
    @classmethod
    def _named(cls, teachers: dict[str, str]) -> dict[str, str]:
        for domain, model in teachers.items():
            if not domain or not model:
                raise ValueError(f"teachers: empty domain or model in {domain!r}: {model!r}")
        return teachers
