"""The group sampler: which items are generated, and how their groups are drawn.

One extension point (:class:`GroupSampler`, ``base.py``) that the rollout pool and the
rollout worker call; a registry keyed by ``selection.kind`` and
``rollout.group_sampling`` (``registry.py``); the draw rules (``draws.py``); and the
built-in samplers: the per-prompt posterior (``posterior.py``), the likelihood gate
(``likelihood.py``, with ``gate.py`` and ``candidates.py``), the curriculum
(``curriculum.py``, with ``levels.py`` and ``budgets.py``), and hints for all-wrong
prompts (``hints.py``, with ``hint_solutions.py``).
"""

from streamrl.rollout.selection import curriculum as curriculum  # registers "curriculum"
from streamrl.rollout.selection import hints as hints  # registers "hints"
from streamrl.rollout.selection import likelihood as likelihood  # registers "likelihood"
from streamrl.rollout.selection import posterior as posterior  # registers "posterior"
from streamrl.rollout.selection.base import GroupSampler, SamplerContext, SamplerSetup, Source
from streamrl.rollout.selection.registry import (
    UnknownKind,
    build_sampler,
    check_draws,
    check_sampler,
    draws_named,
    register_draws,
    register_sampler,
    sampler_kinds,
)

__all__ = [
    "GroupSampler",
    "SamplerContext",
    "SamplerSetup",
    "Source",
    "UnknownKind",
    "build_sampler",
    "check_draws",
    "check_sampler",
    "draws_named",
    "register_draws",
    "register_sampler",
    "sampler_kinds",
]
