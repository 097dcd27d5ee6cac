"""The README's custom episode: at most 20 lines, its rewards against hand-computed
values, and the documented command (``streamrl train --import brief
rollout.episode=brief``) trains with it through the real command line."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from streamrl.config import load_config
from streamrl.core.types import GenerationResult, Item, SamplingParams
from streamrl.models import load_model_and_tokenizer
from streamrl.rollout.rewards import build_reward
from tests.paths import ROOT

README = ROOT / "README.md"


def readme_episode() -> str:
    """The Python block of the README's "A custom episode" section."""
    section = README.read_text().split("## A custom episode", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def brief():
    """The README's episode class; its registration is undone afterwards."""
    from streamrl.rollout.episodes import base

    saved = dict(base._EPISODES)
    namespace: dict = {}
    exec(compile(readme_episode(), str(README), "exec"), namespace)
    yield namespace["BriefAnswer"]
    base._EPISODES.clear()
    base._EPISODES.update(saved)


class ScriptedEngine:
    """Answers every request with the given text's tokens, log-prob -0.5, version 3."""

    def __init__(self, tokenizer, text: str) -> None:
        self.ids = tokenizer.encode(text, add_special_tokens=False)
        self.requests: list = []

    async def agenerate(self, request):
        self.requests.append(request)
        n = len(self.ids)
        return GenerationResult(request.prompt_ids, self.ids, [-0.5] * n, [3] * n, "stop")


def test_the_example_fits_in_20_lines() -> None:
    lines = [line for line in readme_episode().splitlines() if line.strip()]
    assert len(lines) <= 20, f"the README's episode has {len(lines)} lines"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("46", 1.0), ("46 is it", 1.0 - 0.1 * 4), ("45 is it", -0.1 * 4), ("45", 0.0)],
)
def test_reward_less_a_penalty_per_token_past_the_fourth(brief, text, expected) -> None:
    _, tokenizer = load_model_and_tokenizer("tiny-small")
    reward = build_reward(load_config(None, []).reward)  # numeric_match, the default
    episode = brief(tokenizer, SamplingParams(temperature=1.0, max_new_tokens=8), reward)
    engine = ScriptedEngine(tokenizer, text)
    item = Item(id="q", prompt="12+34=", answer="46", index=7)
    trajectory = asyncio.run(episode(engine, item, seed=11, greedy=True))
    assert trajectory.reward == pytest.approx(expected)
    assert trajectory.item_index == 7
    assert trajectory.num_generated == len(engine.ids)
    assert trajectory.min_version == 3
    right = float(text.startswith("46"))
    assert trajectory.metadata["reward_components"] == {"numeric_match": right}
    (request,) = engine.requests
    assert request.seed == 11 and request.params.temperature == 0.0  # greedy asked for


@pytest.mark.slow  # a CLI run: ~35 s on 2 shared cores
def test_the_documented_command_trains_with_it(tmp_path: Path, tiny_config) -> None:
    (tmp_path / "brief.py").write_text(readme_episode())
    sizes = ["train.steps=2", "train.items_per_step=2", "rollout.group_size=2"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    tiny = tiny_config.args(*sizes, "run.name=brief", output_dir=Path("runs"))  # under cwd
    args = ["train", "--import", "brief", "rollout.episode=brief", *tiny]
    done = subprocess.run(
        [sys.executable, "-m", "streamrl.cli.main", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "runs" / "brief" / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["eval_accuracy_after"] is not None
    assert not any(k.startswith("stream/failed") and v for k, v in summary.items())
