"""Rules shared by every config value, and the typed options of components.

- :func:`non_finite` finds a NaN or infinity anywhere in a value, also inside the
  free-form ``options`` dictionaries (typed float fields refuse them through the
  sections' ``allow_inf_nan=False``).
- :func:`check_path_component` is the one rule for text that becomes part of a path
  (``run.name``, a Minari dataset id): no separators (unless allowed), no ``..``, not
  absolute, no NUL.
- :func:`validate_options` checks a component's ``options`` (a task source's, a
  reward's, a policy's) against what the component declares: the annotations of its
  signature (through pydantic), or a pydantic model. Problems come back as an
  :class:`OptionsError` with the key path of each, so preflight can name the YAML line.
"""

from __future__ import annotations

import functools
import inspect
import math
import typing
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from streamrl.config.reading import Path_, restore_raw


def non_finite(value: Any, path: Path_ = ()) -> tuple[Path_, float] | None:
    """The first (key path, value) of a NaN or infinite float inside ``value``."""
    stack: list[tuple[Any, Path_]] = [(value, path)]
    while stack:
        v, p = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return p, v
        if isinstance(v, dict):
            stack.extend((x, (*p, str(k))) for k, x in v.items())
        elif isinstance(v, list | tuple):
            stack.extend((x, (*p, str(i))) for i, x in enumerate(v))
    return None


def check_path_component(value: str, *, allow_slash: bool = False) -> str:
    """``value`` if it may name a file or directory under a parent directory (with
    ``allow_slash``: a relative path of such names, e.g. Minari's ``env/name-v0``);
    ValueError otherwise."""
    if not value:
        raise ValueError("expected a non-empty name")
    if "\0" in value:
        raise ValueError("expected a name without a NUL character")
    if "\\" in value or (not allow_slash and "/" in value):
        raise ValueError("expected a name without path separators ('/', '\\')")
    if value.startswith("/"):
        raise ValueError("expected a relative name, not an absolute path")
    if any(part in ("", ".", "..") for part in value.split("/")):
        raise ValueError("expected a name without '.', '..' or empty parts")
    return value


def key_path(path: Iterable[str | int]) -> str:
    """``("data", "options", "sources", "0", "kind")`` -> ``data.options.sources[0].kind``."""
    out = ""
    for part in path:
        part = str(part)
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out


class OptionsError(ValueError):
    """Options that do not fit what their component declares: one ``(key path,
    message, value)`` per problem (``value`` is ``...`` when there is none to show)."""

    def __init__(self, problems: list[tuple[Path_, str, Any]]) -> None:
        self.problems = problems
        super().__init__("\n".join(self.lines()))

    def lines(self, where: Callable[[Path_], str] | None = None) -> list[str]:
        out = []
        for path, message, value in self.problems:
            shown = "" if value is ... else f" (got {value!r})"
            prefix = f"{where(path)}: " if where is not None else ""
            out.append(f"{prefix}{key_path(path)}: {message}{shown}")
        return out


Declared = Callable[..., Any] | type[BaseModel]


def validate_options(
    declared: Declared,
    options: dict[str, Any],
    where: Path_,
    *,
    skip: int = 0,
    raw: dict[Path_, str] | None = None,
) -> dict[str, Any]:
    """``options`` checked against ``declared`` and converted to its types (``"3"`` for an
    int is 3; a text option YAML read as a bool or number is the raw text from ``raw``).

    ``declared`` is a pydantic model, a class (the keyword parameters of its
    ``__init__``, and of its bases' while a ``**kwargs`` passes them on) or a function
    (its parameters after the first ``skip``). Unknown keys are errors unless the
    signature ends in ``**kwargs`` that go nowhere we can see. Raises OptionsError
    naming ``where + key`` for each problem."""
    if not isinstance(options, dict):
        raise OptionsError([(where, "expected a mapping of options", options)])
    model = declared if _is_model(declared) else _signature_model(declared, skip)
    if raw:
        options = {
            k: restore_raw(v, _annotation(model, k), raw, (*where, k)) for k, v in options.items()
        }
    problems: list[tuple[Path_, str, Any]] = []
    for key, value in options.items():
        if found := non_finite(value, (*where, str(key))):
            problems.append((found[0], "Input should be a finite number", found[1]))
    if problems:
        raise OptionsError(problems)
    try:
        checked = model.model_validate(options)
    except ValidationError as e:
        raise OptionsError(_problems(e, model, options, where)) from None
    out = {k: getattr(checked, k) for k in checked.model_fields_set}
    out.update(checked.model_extra or {})
    return {k: out[k] for k in options}  # (the user's order)


def _problems(
    err: ValidationError, model: type[BaseModel], options: dict[str, Any], where: Path_
) -> list[tuple[Path_, str, Any]]:
    """One problem per key path; a union's members' complaints are joined with "or"."""
    accepted = ", ".join(sorted(model.model_fields))
    found: dict[Path_, tuple[list[str], Any]] = {}
    for item in err.errors():
        path = (*where, *_data_path(options, item["loc"]))
        if item["type"] == "extra_forbidden":
            message, value = f"unknown option; accepted: {accepted}", ...
        elif item["type"] == "missing":
            message, value = "required option is missing", ...
        else:
            message, value = item["msg"], item.get("input")
        messages, _ = found.setdefault(path, ([], value))
        if message not in messages:
            messages.append(message)
    return [(path, " or ".join(msgs), value) for path, (msgs, value) in found.items()]


def _data_path(data: Any, loc: tuple[Any, ...]) -> Path_:
    """The part of a pydantic error location that indexes ``data`` (a union adds the
    names of its members, which are no keys)."""
    out: list[str] = []
    for part in loc:
        if (
            isinstance(data, dict)
            and part in data
            or isinstance(data, list)
            and isinstance(part, int)
            and 0 <= part < len(data)
        ):
            data = data[part]
        else:
            if isinstance(data, dict):
                out.append(str(part))  # a missing or unknown key
            break
        out.append(str(part))
    return tuple(out)


def _is_model(declared: Any) -> bool:
    return isinstance(declared, type) and issubclass(declared, BaseModel)


def _annotation(model: type[BaseModel], key: str) -> Any:
    info = model.model_fields.get(key)
    return Any if info is None else info.annotation


@functools.cache
def _signature_model(declared: Callable[..., Any], skip: int) -> type[BaseModel]:
    """A pydantic model of ``declared``'s keyword parameters (see validate_options)."""
    fields: dict[str, Any] = {}
    open_ended = False
    for fn in _functions(declared):
        params = list(inspect.signature(fn).parameters.values())
        if not inspect.isclass(declared):
            params = params[skip:]
        hints = _hints(fn)
        for p in params:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name == "self":
                continue
            default = ... if p.default is p.empty else p.default
            fields.setdefault(p.name, (hints.get(p.name, Any), default))
        open_ended = any(p.kind is p.VAR_KEYWORD for p in params)
        if not open_ended:  # (a class's bases get the rest through **kwargs)
            break
    config = ConfigDict(
        extra="allow" if open_ended else "forbid",
        arbitrary_types_allowed=True,
        allow_inf_nan=False,
    )
    name = getattr(declared, "__qualname__", "options")
    return create_model(f"{name}Options", __config__=config, **fields)


def _functions(declared: Callable[..., Any]) -> list[Callable[..., Any]]:
    """The function itself, or a class's ``__init__`` and its bases' (nearest first)."""
    if not inspect.isclass(declared):
        return [declared]
    return [
        cls.__init__
        for cls in inspect.getmro(declared)
        if "__init__" in vars(cls) and cls.__init__ is not object.__init__
    ]


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """The parameters' resolved annotations (none where they cannot be resolved: a
    name imported only for type checkers)."""
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception:
        return {}
