"""Loading a config: a YAML file and ``key=value`` overrides into a validated
:class:`~streamrl.config.schema.Config`, with errors that name the file, line and key
(renamed keys name their new key), and saving one back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from streamrl.config import algorithm
from streamrl.config.plugins import PluginError, import_plugins
from streamrl.config.reading import ConfigSource, YamlDoc, YamlError, keep_raw_strings, read_yaml
from streamrl.config.schema import Config


class ConfigError(ValueError):
    """A config problem, with the file, line and key when known."""


#: keys that were renamed: the old name is rejected with a message naming the new one
RENAMED_KEYS = {
    "train.batch_size": "train.items_per_step",
    "train.micro_batch_size": "train.micro_batch_sequences",
    "sft.batch_size": "sft.examples_per_step",
    "rollout.max_batch_size": "rollout.decode_slots",
    "stream.max_inflight_groups": "stream.max_inflight_items",
    **algorithm.RENAMED_KEYS,
}
#: values that changed with their key: new key -> {old value: new value}
RENAMED_VALUES = {**algorithm.RENAMED_VALUES}


def source_of(cfg: Config) -> ConfigSource:
    """Where ``cfg``'s values came from (``<defaults>`` for a config built in code)."""
    return cfg._source


def parse_override(text: str) -> tuple[list[str], Any]:
    """``'train.lr=1e-3'`` -> (['train', 'lr'], 0.001). Values are parsed as YAML."""
    keys, doc = _read_override(text)
    return keys, doc.data


def _read_override(text: str) -> tuple[list[str], YamlDoc]:
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected KEY=VALUE, e.g. train.steps=10")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r}: empty key")
    keys = key.split(".")
    if raw == "":
        return keys, YamlDoc("")
    try:
        return keys, read_yaml(raw, f"override {key}", tuple(keys))
    except YamlError as e:
        raise ConfigError(str(e)) from None


def _set_path(data: dict[str, Any], path: list[str], value: Any, origin: str) -> None:
    node = data
    for part in path[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"{origin}: {'.'.join(path)}: {part!r} is not a section")
        node = child
    node[path[-1]] = value


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    imports: list[str] | tuple[str, ...] = (),
) -> Config:
    """Load a YAML config (or the defaults) and apply dotted overrides. A text field
    takes the text the user typed (``run.name=off`` is "off", not YAML 1.1's false).
    The ``plugins`` modules, and ``imports`` (``--import``, added to ``plugins``), are
    imported before the config is validated (:mod:`streamrl.config.plugins`)."""
    data: dict[str, Any] = {}
    source = ConfigSource()
    if path is not None:
        source.origin = str(path)
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
        try:
            doc = read_yaml(text, str(path))
        except YamlError as e:
            raise ConfigError(str(e)) from None
        if doc.data is None:
            doc.data = {}
        if not isinstance(doc.data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
        data, source.lines, source.raw = doc.data, doc.lines, doc.raw
    for text_override in overrides or []:
        keys, doc = _read_override(text_override)
        _set_path(data, keys, doc.data, "override")
        at = tuple(keys)
        source.raw = {p: v for p, v in source.raw.items() if p[: len(at)] != at}
        source.raw.update(doc.raw)
        source.overridden.add(at)
    _import_plugins(data, list(imports), source)
    try:
        cfg = Config.model_validate(keep_raw_strings(data, Config, source.raw))
    except ValidationError as e:
        raise ConfigError(_format_errors(e, source)) from None
    cfg._source = source
    return cfg


def _import_plugins(data: dict[str, Any], imports: list[str], source: ConfigSource) -> None:
    """Import the config's ``plugins`` and then ``imports``, which join the list."""
    listed = data.get("plugins") or []
    if not isinstance(listed, list):
        return  # (validation names the wrong type)
    names = list(dict.fromkeys([*listed, *imports]))
    if imports:
        data["plugins"] = names

    def where(i: int) -> str:
        return source.where(("plugins", str(i))) if i < len(listed) else "--import"

    try:
        import_plugins(names, where)
    except PluginError as e:
        raise ConfigError(str(e)) from None


def _format_errors(err: ValidationError, source: ConfigSource) -> str:
    out = []
    for item in err.errors():
        loc = tuple(str(p) for p in item["loc"])
        key = ".".join(loc) or "<root>"
        msg = item["msg"].removeprefix("Value error, ")
        value = item.get("input")
        if item["type"] == "extra_forbidden":
            msg = _renamed(key, value)
        if item["type"] == "finite_entry":  # inside a dictionary or list: name the entry
            loc = (*loc, *item["ctx"]["path"].split("."))
            key, value = ".".join(loc), item["ctx"]["value"]
        whole = isinstance(value, dict) and len(loc) <= 1  # a section: do not dump it
        shown = "" if item["type"] == "missing" or whole else f" (got {value!r})"
        out.append(f"{source.where(loc)}: {key}: {msg}{shown}")
    if len(out) == 1:
        return f"invalid config: {out[0]}"
    return "invalid config:\n  " + "\n  ".join(out)


def _renamed(key: str, value: Any) -> str:
    """What an unknown key's error says: its new name if it was renamed (and its value's,
    if that was renamed too), else that it is unknown."""
    new = RENAMED_KEYS.get(key)
    if new is None:
        return "unknown key"
    values = RENAMED_VALUES.get(new, {})
    if isinstance(value, str) and value in values:
        return f"renamed to {new}, and {value!r} to {values[value]!r}: {new}: {values[value]}"
    return f"renamed to {new}"


def config_to_dict(cfg: Config) -> dict[str, Any]:
    return cfg.model_dump(mode="json")


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
