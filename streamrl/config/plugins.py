"""Plugins: the user's Python modules, imported before a config is validated.

A module that registers a task source, reward, episode, algorithm or tool
(``register_task_source``, ``@register_reward``...) is named in the config's
``plugins`` list or given on the command line (``streamrl train --import my_module``,
repeatable, which adds it to ``plugins``, so the run directory's config, and with it
``--resume`` and ``streamrl eval RUN_DIR``, imports it again). Modules are looked up on
``sys.path`` with the current directory first, as ``python -m`` does.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable

_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def check_module_name(name: str) -> str:
    """``name`` if it is a dotted module name (``pkg.module``); ValueError otherwise."""
    if not isinstance(name, str) or not _MODULE_NAME.fullmatch(name):
        raise ValueError(
            f"expected a module name such as my_plugins or pkg.sources (got {name!r}); "
            "a file my_plugins.py in the current directory is the module my_plugins"
        )
    return name


def import_plugins(names: list[str], where: Callable[[int], str]) -> None:
    """Import each module (once); ``where(i)`` names the place the ``i``-th came from,
    for the error when one cannot be imported."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    for i, name in enumerate(names):
        try:
            importlib.import_module(check_module_name(name))
        except ValueError as e:
            raise PluginError(f"{where(i)}: plugins[{i}]: {e}") from None
        except ImportError as e:
            raise PluginError(
                f"{where(i)}: plugins[{i}]: cannot import {name!r}: {e} (a plugin is a module "
                f"on the Python path; the current directory {cwd} is searched first)"
            ) from None


class PluginError(ValueError):
    """A plugin module that cannot be imported, with where it was named."""
