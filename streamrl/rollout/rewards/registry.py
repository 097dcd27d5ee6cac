"""Reward functions by name, and their weighted, guarded composition.

>>> from streamrl.core.types import Item
>>> reward = CompositeReward([("numeric_match", 1.0), ("format_reward", 0.1)], timeout_s=5.0)
>>> result = reward("46", Item(id="q", prompt="12+34=", answer="46"))
>>> result.total, result.components
(1.1, {'numeric_match': 1.0, 'format_reward': 1.0})
>>> reward.close()

A component may apply to some domains only (``metadata["domain"]``, set by the
``mixture`` task source); on other items it is absent and adds nothing:

>>> reward = CompositeReward([("numeric_match", 1.0), ("exact_match", 1.0, {}, ["chat"])])
>>> reward("46", Item(id="q", prompt="12+34=", answer="46", metadata={"domain": "math"}))
RewardResult(total=1.0, components={'numeric_match': 1.0}, errors={}, details={})
>>> reward.close()

Built in: ``exact_match``, ``numeric_match``, ``math_verify``, ``format_reward`` and
``reasoning_gym`` (:mod:`streamrl.rollout.rewards.functions`), ``reward_model`` (a
sequence-classification model, :mod:`streamrl.rollout.rewards.reward_model`) and ``llm_judge``
(a judge model through the inference engine, :mod:`streamrl.rollout.rewards.llm_judge`).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import pickle
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from streamrl.config.options import validate_options
from streamrl.core.types import Item
from streamrl.rollout.rewards import (
    arena,
    functions,
    group,
    judges,
    llm_judge,
    reward_model,
    rubric,
    unit_tests,
)
from streamrl.rollout.rewards.group import group_reward, is_group_reward, run_group
from streamrl.rollout.rewards.guard import Outcome, RewardGuard
from streamrl.sources.mixture import item_domain

if TYPE_CHECKING:
    from streamrl.config import RewardConfig

RewardFn = Callable[[str, Item], float]
F = TypeVar("F", bound=Callable[..., float])

_REWARDS: dict[str, Callable[..., float]] = {
    "exact_match": functions.exact_match,
    "numeric_match": functions.numeric_match,
    "math_verify": functions.math_verify,
    "format_reward": functions.format_reward,
    "reasoning_gym": functions.reasoning_gym,
    "reward_model": reward_model.reward_model,
    "llm_judge": llm_judge.llm_judge,
    "unit_tests": unit_tests.unit_tests,  # the code's tests in the sandbox: see unit_tests.py
    **group.GROUP_REWARDS,  # fn(completions, item) -> list[float]: see group.py
    **arena.ARENA_REWARDS,  # a judge compares answers two at a time: see arena.py
    **rubric.RUBRIC_REWARDS,  # a judge scores each criterion of the item's rubric
}

# Optional set-up of a named reward, run by CompositeReward when it is built:
# ``setup(options, load)`` checks the options (a missing model path fails the build, not
# every call) and, when ``load`` (thread isolation: the calls run in this process), loads
# what the calls need, so that no guarded call is charged the loading (it could time out).
Setup = Callable[[dict[str, Any], bool], None]


def _extracts(options: dict[str, Any], load: bool) -> None:
    """majority_vote's ``extract`` names an extraction (or a valid regex)."""
    try:
        group.extractor(options.get("extract", "last_number"))
    except re.error as e:
        raise ValueError(f"majority_vote: extract is not a regular expression: {e}") from None


def _known_correct(options: dict[str, Any], load: bool) -> None:
    """length_aware's ``correct`` is one of its rule-based checks."""
    name = options.get("correct", "numeric_match")
    if name not in group.CORRECTNESS:
        raise ValueError(f"correct={name!r} is not one of {sorted(group.CORRECTNESS)}")


def _compiles(options: dict[str, Any], load: bool) -> None:
    """format_reward's pattern is a regular expression (not every call's failure)."""
    pattern = options.get("pattern", functions.INTEGER_PATTERN)
    try:
        re.compile(pattern)
    except re.error as e:
        raise ValueError(
            f"format_reward: pattern {pattern!r} is not a regular expression: {e}"
        ) from None


_SETUPS: dict[str, Setup] = {
    "format_reward": _compiles,
    "reward_model": reward_model.setup,
    "llm_judge": llm_judge.setup,
    "majority_vote": _extracts,
    "length_aware": _known_correct,
    "pairwise_judge": arena.setup,
    "tournament_judge": arena.setup,
    "rubric_judge": rubric.setup,
    "unit_tests": unit_tests.setup,
}


# Heavy modules a built-in reward imports lazily; CompositeReward imports them up front
# (and has process workers preload them) so that no guarded call is charged the import
# (it could time out). (The model rewards' process workers still load their model on
# their first call: reward.timeout_s must cover that.)
_IMPORTS: dict[str, tuple[str, ...]] = {
    "math_verify": ("math_verify",),
    "reasoning_gym": ("reasoning_gym",),
    "reward_model": ("streamrl.models.loading",),  # (transformers' Auto classes)
    "llm_judge": ("streamrl.models", "streamrl.engines.inference.engine"),
    **dict.fromkeys(
        ("pairwise_judge", "tournament_judge", "rubric_judge"),
        ("streamrl.models", "streamrl.engines.inference.engine"),  # (judge.backend: engine)
    ),
}


def register_reward(
    name: str, *, setup: Setup | None = None, group: bool = False
) -> Callable[[F], F]:
    """Decorator: make ``fn(completion, item, **options) -> float`` available by name
    (``group=True``: ``fn(completions, item, **options) -> list[float]``, one value per
    answer of the group; see :mod:`streamrl.rollout.rewards.group`).

    ``setup(options, load)``, if given, runs when a :class:`CompositeReward` using the
    reward is built: it checks the options and, when ``load``, loads models up front.
    """

    def decorator(fn: F) -> F:
        if name in _REWARDS and _REWARDS[name] is not fn:
            raise ValueError(f"reward {name!r} is already registered")
        if group:
            group_reward(fn)
        _REWARDS[name] = fn
        if setup is not None:
            _SETUPS[name] = setup
        return fn

    return decorator


def reward_names() -> list[str]:
    """Registered reward names (per answer and per group), sorted."""
    return sorted(_REWARDS)


def is_group(name: str) -> bool:
    """Whether the registered reward ``name`` scores whole groups."""
    return name in _REWARDS and is_group_reward(_REWARDS[name])


def reward_options(
    name: str,
    options: dict[str, Any],
    where: tuple[str, ...] = ("options",),
    raw: dict[tuple[str, ...], str] | None = None,
) -> dict[str, Any]:
    """``options`` checked against the keyword parameters of the reward ``name`` (after
    ``completion, item``) and converted to their annotated types; an
    :class:`~streamrl.config.options.OptionsError` names ``where`` + key of each bad one.

    >>> reward_options("numeric_match", {"tol": "0.5"})
    {'tol': 0.5}
    """
    if name not in _REWARDS:
        raise ValueError(f"unknown reward {name!r}; known: {', '.join(reward_names())}")
    return validate_options(_REWARDS[name], options, where, skip=2, raw=raw)


def get_reward(name: str, **options: Any) -> RewardFn:
    """The reward registered as ``name``, with ``options`` (checked) bound as keyword
    arguments.

    >>> get_reward("format_reward", pattern=r"\\d+")("46", None)
    1.0
    """
    options = reward_options(name, options)
    fn = _REWARDS[name]
    return functools.partial(fn, **options) if options else fn


@dataclass
class RewardResult:
    """One scored completion.

    ``total`` is the weighted sum of the components, or None when any component
    failed (``errors`` then maps its name to the error text, and its component value
    is None). With ``on_error="zero"`` a failed component counts as 0 in ``total``
    and is still listed in ``errors``. A component that returned a
    :class:`~streamrl.rollout.rewards.guard.Scored` leaves its ``report`` (in ``reports``,
    by component) and ``metrics`` (summed) here.
    """

    total: float | None
    components: dict[str, float | None] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    # a group component's named numbers for this answer (group.Scores), by component
    details: dict[str, dict[str, float]] = field(default_factory=dict)
    reports: dict[str, Any] = field(default_factory=dict, repr=False)
    metrics: dict[str, float] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return not self.errors

    def plus(self, other: RewardResult) -> RewardResult:
        """Both results' components together (a completion's own and its group's).

        >>> RewardResult(1.0, {"a": 1.0}).plus(RewardResult(0.5, {"b": 0.5}))
        RewardResult(total=1.5, components={'a': 1.0, 'b': 0.5}, errors={}, details={})
        """
        total = None if self.total is None or other.total is None else self.total + other.total
        return RewardResult(
            total,
            {**self.components, **other.components},
            {**self.errors, **other.errors},
            {**self.details, **other.details},
            {**self.reports, **other.reports},
            _summed(self.metrics, other.metrics),
        )

    def record(self, metadata: dict[str, Any]) -> dict[str, Any]:
        """``metadata`` (an episode's) with this result in it: ``reward_components``,
        ``reward_errors``, and where components left them ``reward_reports`` and their
        ``metrics`` (added to the episode's own)."""
        metadata["reward_components"], metadata["reward_errors"] = self.components, self.errors
        if self.reports:
            metadata["reward_reports"] = self.reports
        if self.metrics:
            metadata["metrics"] = _summed(metadata.get("metrics") or {}, self.metrics)
        return metadata


def _summed(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in {**a, **b}}


Component = (
    tuple[str | RewardFn, float]
    | tuple[str | RewardFn, float, dict[str, Any]]
    | tuple[str | RewardFn, float, dict[str, Any], Sequence[str] | None]
)


@dataclass
class _Part:
    """One component as built: its function, weight, domains and whether it scores groups."""

    fn: Callable[..., Any]
    weight: float
    domains: frozenset[str] | None
    group: bool
    ref: str | None  # the registry name, if it came by name
    options: dict[str, Any]


def _part(comp: Component) -> tuple[str, _Part]:
    """The base name and the built part of one ``(name_or_fn, weight[, options[, domains]])``."""
    if len(comp) not in (2, 3, 4):
        form = "(name_or_fn, weight[, options[, domains]])"
        raise ValueError(f"reward component must be {form}: {comp!r}")
    ref, weight = comp[0], float(comp[1])
    options = (comp[2] if len(comp) >= 3 else None) or {}
    domains = _domains(comp[3] if len(comp) == 4 else None, comp)
    if isinstance(ref, str):
        options = reward_options(ref, options)
        fn = get_reward(ref, **options)
        return ref, _Part(fn, weight, domains, is_group(ref), ref, options)
    if callable(ref):
        fn = functools.partial(ref, **options) if options else ref
        base = getattr(ref, "__name__", type(ref).__name__)
        return base, _Part(fn, weight, domains, is_group_reward(ref), None, options)
    raise ValueError(f"reward component must be a name or a function, got {ref!r}")


def _check_picklable(parts: dict[str, _Part]) -> None:
    for name, part in parts.items():
        try:
            pickle.dumps(part.fn)
        except Exception as e:
            raise ValueError(
                f"reward component {name!r} cannot run in a worker process (it must be "
                f"a module-level function or a partial of one): {e}"
            ) from e


def _set_up(parts: dict[str, _Part], load: bool) -> tuple[str, ...]:
    """Import the heavy modules the named rewards need and run their set-ups; the
    modules, for process workers to preload."""
    preload = [m for p in parts.values() if p.ref in _IMPORTS for m in _IMPORTS[p.ref]]
    for module in preload:
        importlib.import_module(module)
    for name, part in parts.items():  # (process workers load on their first call)
        if part.ref in _SETUPS:
            try:
                _SETUPS[part.ref](part.options, load)
            except (OSError, ValueError) as e:
                raise ValueError(f"reward component {name!r}: {e}") from e
    return tuple(dict.fromkeys(preload))


class CompositeReward:
    """Weighted sum of reward functions, each run under a :class:`RewardGuard`.

    Args:
        components: ``(name_or_fn, weight)``, ``(name_or_fn, weight, options)`` or
            ``(name_or_fn, weight, options, domains)``; names come from the registry,
            functions are used as they are. A component is reported under its name (a
            function's ``__name__``; repeats get ``#2``, ``#3``...). A component with
            ``domains`` (a list of names; None: every item) scores only items whose
            ``metadata["domain"]`` is one of them: for other items it is absent from
            ``components`` and adds nothing to ``total`` (an item no component applies
            to scores 0.0, with no error).
        timeout_s: per-component time limit (components run concurrently).
        on_error: ``"fail"`` (total is None when a component fails) or ``"zero"``.
        guard: share an existing guard; by default the composite owns one, of the
            ``isolation`` backend (``"thread"`` or ``"process"``, whose workers each get
            ``memory_limit_mb`` of address space and import the heavy modules the named
            rewards need). In process mode every component must pickle: registry names
            and module-level functions (or partials of them) do, lambdas do not.

    A group reward (:mod:`streamrl.rollout.rewards.group`) is a component too: it is
    left out of :meth:`ascore` (one answer) and scored by :meth:`ascore_group` over the
    whole group, once, under the same guard; its failure, a wrong number of values
    included, is each answer's failed component.

    Named rewards with a set-up (``reward_model``, ``llm_judge``) check their options
    here, and under thread isolation load their models here too.
    """

    def __init__(
        self,
        components: Sequence[Component],
        timeout_s: float = 5.0,
        *,
        on_error: Literal["fail", "zero"] = "fail",
        guard: RewardGuard | None = None,
        isolation: Literal["thread", "process"] = "thread",
        memory_limit_mb: int | None = None,
    ) -> None:
        if not components:
            raise ValueError("CompositeReward needs at least one component")
        if on_error not in ("fail", "zero"):
            raise ValueError(f"on_error must be 'fail' or 'zero', got {on_error!r}")
        self.on_error = on_error
        self.parts: dict[str, _Part] = {}
        for comp in components:
            base, part = _part(comp)
            name, k = base, 1
            while name in self.parts:
                k += 1
                name = f"{base}#{k}"
            self.parts[name] = part
        self.fns: dict[str, RewardFn] = {n: p.fn for n, p in self.parts.items() if not p.group}
        self.group_fns = {n: p.fn for n, p in self.parts.items() if p.group}
        self.weights = {n: p.weight for n, p in self.parts.items()}
        self.domains = {n: p.domains for n, p in self.parts.items()}
        backend = guard.backend if guard else isolation
        if backend == "process":
            _check_picklable(self.parts)
        preload = _set_up(self.parts, backend == "thread")
        self._owns_guard = guard is None
        self.guard = guard or RewardGuard(
            timeout_s, backend=isolation, memory_limit_mb=memory_limit_mb, preload=preload
        )

    @property
    def names(self) -> list[str]:
        return list(self.parts)

    @property
    def has_group(self) -> bool:
        """Whether some component scores whole groups (:meth:`ascore_group`)."""
        return bool(self.group_fns)

    def _admits(self, name: str, item: Item) -> bool:
        return (allowed := self.domains[name]) is None or item_domain(item) in allowed

    def applicable(self, item: Item) -> dict[str, RewardFn]:
        """The per-answer components that score ``item`` (their ``domains`` admit it)."""
        return {name: fn for name, fn in self.fns.items() if self._admits(name, item)}

    def applicable_group(self, item: Item) -> dict[str, Callable[..., list[float]]]:
        """The group components that score ``item``'s group."""
        return {name: fn for name, fn in self.group_fns.items() if self._admits(name, item)}

    def _combine(self, outcomes: dict[str, Outcome]) -> RewardResult:
        components = {name: o.value for name, o in outcomes.items()}
        errors = {name: o.error for name, o in outcomes.items() if o.error is not None}
        scored = [(n, o.scored) for n, o in outcomes.items() if o.scored is not None]
        reports = {n: s.report for n, s in scored if s.report}
        metrics = functools.reduce(_summed, (s.metrics for _, s in scored), {})
        if errors and self.on_error == "fail":
            return RewardResult(None, components, errors, reports=reports, metrics=metrics)
        total = sum((self.weights[n] * (v or 0.0) for n, v in components.items()), 0.0)
        return RewardResult(total, components, errors, reports=reports, metrics=metrics)

    def _per_answer(self, outcomes: dict[str, Outcome], n: int) -> list[RewardResult]:
        """Group outcomes (lists of ``n`` values, or errors) as one result per answer, with
        the details of the components that gave some (:class:`~.group.Scores`)."""
        results = []
        for i in range(n):
            result = self._combine(
                {k: Outcome(o.value[i]) if o.ok else o for k, o in outcomes.items()}
            )
            for k, o in outcomes.items():
                if isinstance(o.value, group.Scores):
                    result.details[k] = o.value.details[i]
            results.append(result)
        return results

    def __call__(self, completion: str, item: Item) -> RewardResult:
        """Score one completion (blocks at most about ``timeout_s``) by its per-answer
        components."""
        fns = self.applicable(item)
        futures = {n: self.guard.submit(fn, completion, item) for n, fn in fns.items()}
        return self._combine({n: self.guard.outcome(f) for n, f in futures.items()})

    async def ascore(self, completion: str, item: Item) -> RewardResult:
        """Async ``__call__``: never blocks the event loop."""
        fns = self.applicable(item)
        futures = {n: self.guard.submit(fn, completion, item) for n, fn in fns.items()}
        outcomes = await asyncio.gather(*(self.guard.aoutcome(f) for f in futures.values()))
        return self._combine(dict(zip(futures, outcomes, strict=True)))

    def score_group(self, completions: Sequence[str], item: Item) -> list[RewardResult]:
        """The group components' results for each of ``completions`` (the answers of one
        item's group, in order; a :class:`~streamrl.rollout.rewards.group.Completions`
        carries their token lengths). Blocks at most about ``timeout_s``."""
        fns = self.applicable_group(item)
        futures = {n: self.guard.submit(run_group, fn, completions, item) for n, fn in fns.items()}
        outcomes = {n: self.guard.outcome(f, group=True) for n, f in futures.items()}
        return self._per_answer(outcomes, len(completions))

    async def ascore_group(self, completions: Sequence[str], item: Item) -> list[RewardResult]:
        """Async :meth:`score_group`: never blocks the event loop."""
        fns = self.applicable_group(item)
        futures = {n: self.guard.submit(run_group, fn, completions, item) for n, fn in fns.items()}
        waits = (self.guard.aoutcome(f, group=True) for f in futures.values())
        outcomes = dict(zip(futures, await asyncio.gather(*waits), strict=True))
        return self._per_answer(outcomes, len(completions))

    def bind_policy(self, engine: Any, tokenizer: Any) -> None:
        """Give the components that ask the policy itself (a judge with ``backend:
        policy``) the rollout worker's ``engine``: the worker calls this once it is built."""
        for name, part in self.parts.items():
            options = {k: judges.bind_policy(v, engine, tokenizer) for k, v in part.options.items()}
            if part.ref is None or all(options[k] is v for k, v in part.options.items()):
                continue
            part.options, part.fn = options, functools.partial(_REWARDS[part.ref], **options)
            (self.group_fns if part.group else self.fns)[name] = part.fn

    def close(self) -> None:
        """Stop the guard's workers if this composite created the guard."""
        if self._owns_guard:
            self.guard.close()


def _domains(domains: Sequence[str] | None, comp: object) -> frozenset[str] | None:
    if domains is None:
        return None
    if isinstance(domains, str) or not all(isinstance(d, str) for d in domains) or not domains:
        raise ValueError(
            f"reward component domains must be None or a non-empty list of names: {comp!r}"
        )
    return frozenset(domains)


def build_reward(cfg: RewardConfig) -> CompositeReward:
    """The run's reward: ``reward.components`` (each with its ``domains``) under a guard of
    ``reward.isolation``."""
    components = [(c.name, c.weight, c.options, c.domains) for c in cfg.components]
    return CompositeReward(
        components,
        timeout_s=cfg.timeout_s,
        isolation=cfg.isolation,
        memory_limit_mb=cfg.memory_limit_mb,
    )


def build_group_reward(cfg: RewardConfig) -> CompositeReward | None:
    """The run's group components alone (for an endpoint, whose clients report the
    per-answer reward themselves), or None when it has none."""
    components = [(c.name, c.weight, c.options, c.domains) for c in cfg.components]
    components = [c for c in components if is_group(c[0])]
    if not components:
        return None
    return CompositeReward(
        components,
        timeout_s=cfg.timeout_s,
        isolation=cfg.isolation,
        memory_limit_mb=cfg.memory_limit_mb,
    )
