"""Task sources: where training and evaluation items come from.

``build_task_source(kind, **options)`` builds one by name:

============== ============================================ ==========================
kind           class                                        options
============== ============================================ ==========================
arithmetic     :class:`ArithmeticTaskSource`                digits, operators, ...
jsonl          :class:`JsonlTaskSource`                     path, eval_path, ...
parquet        :class:`ParquetTaskSource`                   path, eval_path, ...
datasets       :class:`DatasetsTaskSource`                  path, format, split, ...
reasoning_gym  :class:`ReasoningGymTaskSource`              task, size, seed, ...
longtail       :class:`LongTailTaskSource`                  long_fraction, long_tokens, ...
tool_arithmetic :class:`ToolArithmeticTaskSource`           tool_fraction, tool_format, ...
mixture        :class:`MixtureTaskSource`                   sources: [{name, kind, ...}]
minari         :class:`MinariTaskSource`                    dataset_id, batch_transitions, ...
textarena      :class:`TextArenaTaskSource`                 env_id, seats, eval_opponents, ...
verifiers      :class:`VerifiersTaskSource`                 load, args, demonstration, ...
openenv        :class:`OpenEnvTaskSource`                   load or url, action_field, ...
pettingzoo     :class:`PettingZooTaskSource`                env_id, policies, agent_id, ...
code           :class:`CodeTaskSource`                      difficulty, families, tests, ...
============== ============================================ ==========================

The file schema is documented in :mod:`streamrl.sources.files`; domains (a mixture's
sources) in :mod:`streamrl.sources.mixture`, with the helpers :func:`item_domain` and
:func:`item_correct_reward`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamrl.config.options import OptionsError, validate_options
from streamrl.sources.arithmetic import ArithmeticTaskSource
from streamrl.sources.base import DataError, FiniteTaskSource, TaskSource
from streamrl.sources.code_tasks import CodeTaskSource
from streamrl.sources.files import DatasetsTaskSource, JsonlTaskSource, ParquetTaskSource
from streamrl.sources.gym import GymTaskSource
from streamrl.sources.longtail import LongTailTaskSource
from streamrl.sources.minari import MinariTaskSource
from streamrl.sources.mixture import MixtureTaskSource, item_correct_reward, item_domain
from streamrl.sources.openenv import OpenEnvTaskSource
from streamrl.sources.pettingzoo import PettingZooTaskSource
from streamrl.sources.reasoning_gym import ReasoningGymTaskSource
from streamrl.sources.textarena import TextArenaTaskSource
from streamrl.sources.tool_arithmetic import ToolArithmeticTaskSource
from streamrl.sources.verifiers import VerifiersTaskSource

__all__ = [
    "DATA_OPTIONS",
    "ArithmeticTaskSource",
    "CodeTaskSource",
    "DataError",
    "DatasetsTaskSource",
    "FiniteTaskSource",
    "GymTaskSource",
    "JsonlTaskSource",
    "LongTailTaskSource",
    "MinariTaskSource",
    "MixtureTaskSource",
    "OpenEnvTaskSource",
    "ParquetTaskSource",
    "PettingZooTaskSource",
    "ReasoningGymTaskSource",
    "TaskSource",
    "TextArenaTaskSource",
    "ToolArithmeticTaskSource",
    "VerifiersTaskSource",
    "build_task_source",
    "make_task_source",
    "task_source_options",
    "item_correct_reward",
    "item_domain",
    "register_task_source",
    "task_source_kinds",
]

DATA_OPTIONS = ("data", "options")  # the key path of a run's task-source options

_KINDS: dict[str, Callable[..., TaskSource]] = {
    "arithmetic": ArithmeticTaskSource,
    "jsonl": JsonlTaskSource,
    "parquet": ParquetTaskSource,
    "datasets": DatasetsTaskSource,
    "reasoning_gym": ReasoningGymTaskSource,
    "longtail": LongTailTaskSource,
    "gym": GymTaskSource,
    "minari": MinariTaskSource,
    "tool_arithmetic": ToolArithmeticTaskSource,
    "mixture": MixtureTaskSource,
    "textarena": TextArenaTaskSource,
    "verifiers": VerifiersTaskSource,
    "openenv": OpenEnvTaskSource,
    "pettingzoo": PettingZooTaskSource,
    "code": CodeTaskSource,
}


def register_task_source(kind: str, factory: Callable[..., TaskSource]) -> None:
    """Make ``build_task_source(kind, ...)`` call ``factory(**options)``."""
    if kind in _KINDS and _KINDS[kind] is not factory:
        raise ValueError(f"task source kind {kind!r} is already registered")
    _KINDS[kind] = factory


def task_source_kinds() -> list[str]:
    """The registered kinds, sorted."""
    return sorted(_KINDS)


def task_source_options(
    kind: str,
    options: dict[str, Any],
    where: tuple[str, ...] = DATA_OPTIONS,
    raw: dict[tuple[str, ...], str] | None = None,
) -> dict[str, Any]:
    """``options`` checked against what the source ``kind`` declares (its signature's
    annotations) and converted to those types; an :class:`OptionsError` names the key
    path of each bad one (``where`` + key), before anything is built. ``raw``: the text
    of plain YAML scalars (a text option keeps what the user typed)."""
    if kind not in _KINDS:
        raise ValueError(
            f"unknown task source kind {kind!r}; known: {', '.join(task_source_kinds())}"
        )
    return validate_options(_KINDS[kind], options, where, raw=raw)


def make_task_source(
    kind: str, options: dict[str, Any], where: tuple[str, ...] = DATA_OPTIONS
) -> TaskSource:
    """The task source ``kind`` built from ``options`` (checked first). A ValueError the
    source raises about its options' values (``digits must be >= 1``) becomes an
    OptionsError at ``where``; a DataError (a bad row of a file) names its file and line."""
    checked = task_source_options(kind, options, where)
    try:
        return _KINDS[kind](**checked)
    except (OptionsError, DataError):
        raise
    except ValueError as e:
        raise OptionsError([(where, f"{kind}: {e}", ...)]) from None


def build_task_source(kind: str, **options: Any) -> TaskSource:
    """Build the task source ``kind`` with ``options``; unknown kinds/options fail clearly.

    >>> src = build_task_source("arithmetic", digits=1, operators="+")
    >>> next(src.train_iter(seed=0)).prompt
    '6+6='
    """
    return make_task_source(kind, options)
