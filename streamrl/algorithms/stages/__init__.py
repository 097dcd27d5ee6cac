"""Stages that run before RL, in this order: SFT on the task's demonstrations
(``sft.py``), DPO on preference pairs (``dpo.py``) and A-LoL on logged completions with
rewards (``alol.py``). Each is a :class:`~streamrl.algorithms.stages.base.Stage`,
registered in :data:`STAGES` under its config section's name, and off while its
``steps`` is 0; the controller builds and runs every one the same way, then
asynchronous RL: the offline-to-online path in one config.
"""

from __future__ import annotations

from streamrl.algorithms.stages.alol import build_alol_stage, check_alol_file
from streamrl.algorithms.stages.base import (
    Stage,
    StageData,
    StageInputs,
    context_length,
    encode_logged,
    run_stage,
)
from streamrl.algorithms.stages.dpo import build_dpo_stage, check_dpo_file
from streamrl.algorithms.stages.sft import build_sft_stage

#: stage name (its config section) -> its builder, in the order the stages run
STAGES: dict[str, Stage] = {
    "sft": build_sft_stage,
    "dpo": build_dpo_stage,
    "alol": build_alol_stage,
}
PRE_RL_STAGES = tuple(STAGES)
#: stage name -> the check of the logged file it trains on (preflight runs it)
FILE_CHECKS = {"dpo": check_dpo_file, "alol": check_alol_file}

__all__ = [
    "FILE_CHECKS",
    "PRE_RL_STAGES",
    "STAGES",
    "Stage",
    "StageData",
    "StageInputs",
    "build_alol_stage",
    "build_dpo_stage",
    "build_sft_stage",
    "context_length",
    "encode_logged",
    "run_stage",
]
