"""Reading YAML for configs: bounded, located, and faithful to what the user typed.

:func:`read_yaml` parses one YAML document (a config file, or the value of a
``key=value`` override) into plain Python data plus two maps keyed by the key path
(a tuple of strings, list indices as ``"0"``, ``"1"``...):

- ``lines``: the 1-based line of every key and list element, for error messages;
- ``raw``: the text of every plain (unquoted) scalar, so a string field can take
  what the user typed where YAML 1.1 would read something else (``off`` and ``no``
  are booleans, ``12:30`` is 750, ``2024-01-01`` a date): see :func:`keep_raw_strings`.

The cost of reading is bounded by the size of the text: a document may not nest more
than ``MAX_DEPTH`` levels (PyYAML would recurse until Python's stack runs out), and
aliases (``*name``) may not expand it to more than ``MAX_NODES`` values (a few lines of
nested aliases, the "billion laughs", would otherwise stand for billions of values that
every later step walks). A key given twice in one mapping is an error naming both lines.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import BaseModel

Path_ = tuple[str, ...]

MAX_DEPTH = 64  # nesting levels of one document (a config uses about 4)
MAX_NODES = 100_000  # values of one document once its aliases are expanded


class YamlError(ValueError):
    """Unreadable or unbounded YAML; the message names the origin and line."""


@dataclass
class YamlDoc:
    """One parsed document: its data, and the line and raw text of each key path."""

    data: Any
    lines: dict[Path_, int] = field(default_factory=dict)
    raw: dict[Path_, str] = field(default_factory=dict)
    nodes: int = 0  # values visited with aliases expanded (what every later step walks)


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses to compose deeper than ``MAX_DEPTH``."""

    def __init__(self, stream: str, origin: str) -> None:
        super().__init__(stream)
        self.origin, self.depth = origin, 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise YamlError(f"{self.origin}:{line}: nested more than {MAX_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def read_yaml(text: str, origin: str = "<yaml>", prefix: Path_ = ()) -> YamlDoc:
    """Parse ``text``; key paths in the maps start with ``prefix``."""
    try:
        loader = _BoundedLoader(text, origin)  # (its reader refuses control characters)
        try:
            root = loader.get_single_node()
            doc = _walk(root, origin, prefix)
            doc.data = None if root is None else loader.construct_document(root)
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise YamlError(f"{origin}: invalid YAML: {e}") from None
    return doc


def _walk(root: yaml.Node | None, origin: str, prefix: Path_) -> YamlDoc:
    """Lines and raw scalars of every key path, visiting each value once per use (an
    alias's value once per alias), within ``MAX_NODES`` values and ``MAX_DEPTH`` levels
    (a recursive alias, ``&a [*a]``, is infinitely deep)."""
    doc = YamlDoc(None)
    stack: list[tuple[yaml.Node, Path_, int]] = [] if root is None else [(root, prefix, 0)]
    while stack:
        node, path, depth = stack.pop()
        doc.nodes += 1
        line = node.start_mark.line + 1
        if doc.nodes > MAX_NODES:
            raise YamlError(
                f"{origin}:{line}: more than {MAX_NODES} values once its aliases (*name) are "
                "expanded; write the values out, or use fewer nested aliases"
            )
        if depth > MAX_DEPTH:
            raise YamlError(f"{origin}:{line}: nested more than {MAX_DEPTH} levels deep")
        if isinstance(node, yaml.ScalarNode):
            if node.style is None:  # plain: what YAML 1.1 may read as a bool, number, date
                doc.raw[path] = node.value
        elif isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key_node, value_node in node.value:
                key, key_line = str(key_node.value), key_node.start_mark.line + 1
                if key in seen and key != "<<":
                    raise YamlError(
                        f"{origin}:{key_line}: {'.'.join((*path, key))}: duplicate key "
                        f"(first given at line {seen[key]})"
                    )
                seen[key] = key_line
                doc.lines.setdefault((*path, key), key_line)
                stack.append((value_node, (*path, key), depth + 1))
        elif isinstance(node, yaml.SequenceNode):
            for i, child in enumerate(node.value):
                doc.lines.setdefault((*path, str(i)), child.start_mark.line + 1)
                stack.append((child, (*path, str(i)), depth + 1))
    return doc


@dataclass(eq=False)
class ConfigSource:
    """Where a loaded config's values came from: the file, the line of each key path
    and the raw text of each plain scalar (see :mod:`streamrl.config.reading`), and the
    key paths given as command-line overrides. Checks after loading (preflight) use it
    to name the line of a bad option. It is not part of the config's value: any two
    compare equal, so configs with equal values are equal wherever they came from."""

    origin: str = "<defaults>"
    lines: dict[tuple[str, ...], int] = field(default_factory=dict)
    raw: dict[tuple[str, ...], str] = field(default_factory=dict)
    overridden: set[tuple[str, ...]] = field(default_factory=set)

    def where(self, path: tuple[str, ...]) -> str:
        """``file:line`` of ``path`` (or of the deepest section above it that has a
        line), ``command-line override`` when an override set it, else the origin."""
        if any(path[: len(o)] == o or o[: len(path)] == path for o in self.overridden):
            return "command-line override"
        for n in range(len(path), 0, -1):
            if path[:n] in self.lines:
                return f"{self.origin}:{self.lines[path[:n]]}"
        return self.origin

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConfigSource)

    __hash__ = None  # type: ignore[assignment]


# ------------------------------------------------------------ strings as typed


def takes_str(annotation: Any) -> bool:
    """Whether a field of this type holds text: ``str``, ``str | None``, a ``Literal``
    of strings (a bool, number or date YAML read there is the user's text)."""
    if annotation is str:
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return all(isinstance(a, str) for a in args)
    if origin in (typing.Union, types.UnionType):
        return any(takes_str(a) for a in args if a is not type(None))
    if origin is typing.Annotated:
        return takes_str(args[0])
    return False


def restore_raw(value: Any, annotation: Any, raw: dict[Path_, str], path: Path_) -> Any:
    """``value`` as the user typed it when ``annotation`` takes text and YAML read the
    plain scalar at ``path`` as something else (a null stays None)."""
    if takes_str(annotation) and value is not None and not isinstance(value, str | dict | list):
        return raw.get(path, value)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):  # e.g. list[str] | None
        kinds = [a for a in args if a is not type(None)]
        return restore_raw(value, kinds[0], raw, path) if len(kinds) == 1 else value
    if origin is list and args and isinstance(value, list):
        return [restore_raw(v, args[0], raw, (*path, str(i))) for i, v in enumerate(value)]
    if origin is list and args and takes_str(args[0]) and not isinstance(value, dict | str | None):
        return raw.get(path, value)  # one text where a list of them goes (shown as typed)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return keep_raw_strings(value, annotation, raw, path)
    return value


def keep_raw_strings(
    data: Any, model: type[BaseModel], raw: dict[Path_, str], path: Path_ = ()
) -> Any:
    """``data`` (to be validated as ``model``) with every text field as typed: walks
    the model's fields, its sub-models and lists of them."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for name, info in model.model_fields.items():
        if name in out:
            out[name] = restore_raw(out[name], info.annotation, raw, (*path, name))
    return out
