"""Stages that run before RL, in this order: SFT (``streamrl.algorithms.stages.sft``), DPO on preference
pairs (``dpo.py``) and A-LoL on logged completions with rewards (``alol.py``). Each is
off while its ``steps`` is 0; the controller runs every one with the same loop
(:class:`~streamrl.algorithms.stages.base.StageData`), then asynchronous RL: the offline-to-online
path in one config.
"""

from __future__ import annotations

from collections.abc import Callable

from streamrl.algorithms.stages.alol import build_alol_stage
from streamrl.algorithms.stages.base import StageData, context_length, encode_logged
from streamrl.algorithms.stages.dpo import build_dpo_stage

PRE_RL_STAGES = ("sft", "dpo", "alol")

#: stage name -> build(cfg, tokenizer, trainer, max_len) for the logged-data stages
OFFLINE_STAGES: dict[str, Callable[..., StageData]] = {
    "dpo": build_dpo_stage,
    "alol": build_alol_stage,
}

__all__ = [
    "OFFLINE_STAGES",
    "PRE_RL_STAGES",
    "StageData",
    "build_alol_stage",
    "build_dpo_stage",
    "context_length",
    "encode_logged",
]
