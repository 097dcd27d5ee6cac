"""Group samplers by name (``selection.kind``), draw rules by name
(``rollout.group_sampling``), how a run builds its sampler, and preflight's checks.

A new selection idea is a :class:`~streamrl.rollout.selection.base.GroupSampler`
subclass in a module of its own, registered with ``@register_sampler("name")``; listed
in the config's ``plugins`` (or ``--import``), the module is imported before the config
is read, and ``selection.kind: name`` selects it. A draw rule registers with
``register_draws("name", rule, check)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from streamrl.core.types import SamplingParams
from streamrl.rollout.selection.base import GroupSampler, SamplerContext, SamplerSetup
from streamrl.rollout.selection.draws import Draws, independent, stratified

if TYPE_CHECKING:
    from streamrl.config import RolloutConfig, SelectionConfig

Check = Callable[[SamplerContext], None]  # what it sees of the run -> raise ValueError
S = TypeVar("S", bound=type[GroupSampler])

_SAMPLERS: dict[str, type[GroupSampler]] = {"none": GroupSampler}
_DRAWS: dict[str, tuple[Draws, Check | None]] = {}


class UnknownKind(ValueError):
    """A name no sampler or draw rule is registered under; ``key`` is its config key."""

    def __init__(self, key: tuple[str, str], name: str, known: list[str]) -> None:
        super().__init__(f"{'.'.join(key)}: unknown kind {name!r}; known: {', '.join(known)}")
        self.key = key


def register_sampler(kind: str) -> Callable[[S], S]:
    """Class decorator: ``selection.kind: <kind>`` selects this sampler."""

    def decorator(cls: S) -> S:
        if _SAMPLERS.get(kind, cls) is not cls:
            raise ValueError(f"group sampler {kind!r} is already registered")
        _SAMPLERS[kind] = cls
        return cls

    return decorator


def register_draws(name: str, rule: Draws, check: Check | None = None) -> None:
    """``rollout.group_sampling: <name>`` draws a group's samples with ``rule``;
    ``check`` is its preflight check of the run's config."""
    if name in _DRAWS and _DRAWS[name] != (rule, check):
        raise ValueError(f"draw rule {name!r} is already registered")
    _DRAWS[name] = (rule, check)


def sampler_kinds() -> list[str]:
    return sorted(_SAMPLERS)


def sampler_class(kind: str) -> type[GroupSampler]:
    if kind not in _SAMPLERS:
        raise UnknownKind(("selection", "kind"), kind, sampler_kinds())
    return _SAMPLERS[kind]


def draws_named(name: str) -> Draws:
    if name not in _DRAWS:
        raise UnknownKind(("rollout", "group_sampling"), name, sorted(_DRAWS))
    return _DRAWS[name][0]


def build_sampler(
    selection: SelectionConfig,
    rollout: RolloutConfig,
    seed: int,
    tokenizer: Any = None,
    sampling: SamplingParams | None = None,
) -> GroupSampler:
    """The run's group sampler from its ``selection`` and ``rollout`` config sections: the
    pool's side, or with the ``tokenizer`` and ``sampling`` parameters a worker's."""
    cls = sampler_class(selection.kind)
    draws = draws_named(rollout.group_sampling)
    return cls.build(SamplerSetup(selection, rollout.group_size, seed, draws, tokenizer, sampling))


def check_sampler(run: SamplerContext) -> None:
    """Preflight: ``selection.kind`` is registered, no other kind's own option is set, a
    sampler that draws items has a task source, and the sampler's own check passes."""
    sel = run.selection
    cls = sampler_class(sel.kind)
    for kind, other in _SAMPLERS.items():
        for own, (default, why) in {} if other is cls else other.own_options.items():
            if getattr(sel, own) != default:
                key, value = _first_set(own, getattr(sel, own), default)
                raise ValueError(
                    f"selection.{key}={_shown(value)} needs selection.kind={kind} (got "
                    f"{sel.kind!r}): {why}"
                )
    if cls is not GroupSampler and run.endpoint:
        raise ValueError(
            f"selection.kind={sel.kind} needs a task source, but endpoint.enabled=true: "
            "external agents bring their own prompts; set selection.kind=none"
        )
    cls.check(run)


def check_draws(run: SamplerContext) -> None:
    """Preflight: ``rollout.group_sampling`` is registered and its check passes."""
    draws_named(run.rollout.group_sampling)
    check = _DRAWS[run.rollout.group_sampling][1]
    if check is not None:
        check(run)


def _first_set(key: str, value: Any, default: Any) -> tuple[str, Any]:
    """The key and value to name for an option set away from its default: a nested
    section's first field that differs (``curriculum.min_groups``), else the option."""
    if isinstance(value, BaseModel) and isinstance(default, BaseModel):
        for name in type(value).model_fields:
            if getattr(value, name) != getattr(default, name):
                return f"{key}.{name}", getattr(value, name)
    return key, value


def _shown(value: Any) -> str:
    """A value as the config writes it (``true``, not ``True``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _check_stratified(run: SamplerContext) -> None:
    """The built-in engine's counter noise, on a language-model episode of rollout workers."""
    if run.rollout.engine != "local":
        raise ValueError(
            f"rollout.group_sampling=stratified shifts the built-in engine's noise; "
            f"rollout.engine={run.rollout.engine} draws its own"
        )
    if run.policy:
        raise ValueError(
            "rollout.group_sampling=stratified applies to language-model episodes, "
            "not environment policies"
        )
    if run.endpoint:
        raise ValueError(
            "rollout.group_sampling=stratified stratifies the groups of rollout workers; "
            "with endpoint.enabled=true external agents make their own requests"
        )


register_draws("independent", independent)
register_draws("stratified", stratified, _check_stratified)
