"""Shared test set-up: one torch thread (tiny models run faster, and the suite
shares two cores), no hub access, the ``tiny_config`` fixture, and every test under
tests/integration/ marked ``slow``: ``pytest -m "not slow"`` runs the unit tests' fast
core (docs/contributing.md); CI runs everything."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


INTEGRATION = Path(__file__).parent / "integration"


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION in item.path.parents:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny_config(tmp_path: Path):
    """A tiny run's config writing under ``tmp_path``: ``tiny_config("train.steps=2")``;
    ``tiny_config.args(...)`` gives the same run as CLI overrides (tests/tiny_run.py).
    Imported here, not above, so that the hub is offline before streamrl loads."""
    from tests.tiny_run import TinyConfig

    return TinyConfig(tmp_path)
