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
RewardResult(total=1.0, components={'numeric_match': 1.0}, errors={})
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
from streamrl.rollout.rewards import functions, llm_judge, reward_model
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
}

# Optional set-up of a named reward, run by CompositeReward when it is built:
# ``setup(options, load)`` checks the options (a missing model path fails the build, not
# every call) and, when ``load`` (thread isolation: the calls run in this process), loads
# what the calls need, so that no guarded call is charged the loading (it could time out).
Setup = Callable[[dict[str, Any], bool], None]


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
}


def register_reward(name: str, *, setup: Setup | None = None) -> Callable[[F], F]:
    """Decorator: make ``fn(completion, item, **options) -> float`` available by name.

    ``setup(options, load)``, if given, runs when a :class:`CompositeReward` using the
    reward is built: it checks the options and, when ``load``, loads models up front.
    """

    def decorator(fn: F) -> F:
        if name in _REWARDS and _REWARDS[name] is not fn:
            raise ValueError(f"reward {name!r} is already registered")
        _REWARDS[name] = fn
        if setup is not None:
            _SETUPS[name] = setup
        return fn

    return decorator


def reward_names() -> list[str]:
    """Registered reward names, sorted."""
    return sorted(_REWARDS)


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
    and is still listed in ``errors``.
    """

    total: float | None
    components: dict[str, float | None] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


Component = (
    tuple[str | RewardFn, float]
    | tuple[str | RewardFn, float, dict[str, Any]]
    | tuple[str | RewardFn, float, dict[str, Any], Sequence[str] | None]
)


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
        self.fns: dict[str, RewardFn] = {}
        self.weights: dict[str, float] = {}
        self.domains: dict[str, frozenset[str] | None] = {}
        preload: list[str] = []
        setups: list[tuple[str, Setup, dict[str, Any]]] = []
        for comp in components:
            self._add(comp, preload, setups)
        backend = guard.backend if guard else isolation
        if backend == "process":
            self._check_picklable()
        for module in preload:
            importlib.import_module(module)
        for name, setup, options in setups:  # (process workers load on their first call)
            try:
                setup(options, backend == "thread")
            except (OSError, ValueError) as e:
                raise ValueError(f"reward component {name!r}: {e}") from e
        self._owns_guard = guard is None
        self.guard = guard or RewardGuard(
            timeout_s,
            backend=isolation,
            memory_limit_mb=memory_limit_mb,
            preload=tuple(dict.fromkeys(preload)),
        )

    def _add(
        self,
        comp: Component,
        preload: list[str],
        setups: list[tuple[str, Setup, dict[str, Any]]],
    ) -> None:
        """Resolve one component to its function, name it (repeats get ``#2``...), and
        note the modules it preloads and the set-up it needs."""
        if len(comp) not in (2, 3, 4):
            form = "(name_or_fn, weight[, options[, domains]])"
            raise ValueError(f"reward component must be {form}: {comp!r}")
        ref, weight = comp[0], float(comp[1])
        options = (comp[2] if len(comp) >= 3 else None) or {}
        domains = _domains(comp[3] if len(comp) == 4 else None, comp)
        if isinstance(ref, str):
            options = reward_options(ref, options)
            fn, base = get_reward(ref, **options), ref
            if ref in _IMPORTS:
                preload.extend(_IMPORTS[ref])
        elif callable(ref):
            fn = functools.partial(ref, **options) if options else ref
            base = getattr(ref, "__name__", type(ref).__name__)
        else:
            raise ValueError(f"reward component must be a name or a function, got {ref!r}")
        name, k = base, 1
        while name in self.fns:
            k += 1
            name = f"{base}#{k}"
        self.fns[name], self.weights[name], self.domains[name] = fn, weight, domains
        if isinstance(ref, str) and ref in _SETUPS:
            setups.append((name, _SETUPS[ref], options))

    def _check_picklable(self) -> None:
        """Process isolation sends every component to a worker: each must pickle."""
        for name, fn in self.fns.items():
            try:
                pickle.dumps(fn)
            except Exception as e:
                raise ValueError(
                    f"reward component {name!r} cannot run in a worker process (it must be "
                    f"a module-level function or a partial of one): {e}"
                ) from e

    @property
    def names(self) -> list[str]:
        return list(self.fns)

    def applicable(self, item: Item) -> dict[str, RewardFn]:
        """The components that score ``item`` (those whose ``domains`` admit its domain)."""
        domain = item_domain(item)
        return {
            name: fn
            for name, fn in self.fns.items()
            if (allowed := self.domains[name]) is None or domain in allowed
        }

    def _combine(self, outcomes: dict[str, Outcome]) -> RewardResult:
        components = {name: o.value for name, o in outcomes.items()}
        errors = {name: o.error for name, o in outcomes.items() if o.error is not None}
        if errors and self.on_error == "fail":
            return RewardResult(None, components, errors)
        total = sum((self.weights[n] * (v or 0.0) for n, v in components.items()), 0.0)
        return RewardResult(total, components, errors)

    def __call__(self, completion: str, item: Item) -> RewardResult:
        """Score one completion (blocks at most about ``timeout_s``)."""
        fns = self.applicable(item)
        futures = {n: self.guard.submit(fn, completion, item) for n, fn in fns.items()}
        return self._combine({n: self.guard.outcome(f) for n, f in futures.items()})

    async def ascore(self, completion: str, item: Item) -> RewardResult:
        """Async ``__call__``: never blocks the event loop."""
        fns = self.applicable(item)
        futures = {n: self.guard.submit(fn, completion, item) for n, fn in fns.items()}
        outcomes = await asyncio.gather(*(self.guard.aoutcome(f) for f in futures.values()))
        return self._combine(dict(zip(futures, outcomes, strict=True)))

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
