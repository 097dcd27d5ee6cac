"""Every example in docs/architecture.md runs, and plugs in without touching the controller."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from streamrl.models import load_model_and_tokenizer
from streamrl.run.assembly import rollout_spec
from streamrl.run.launch import train
from streamrl.sources import build_task_source
from streamrl.stream.backends import RolloutPool, WorkerSpec
from streamrl.stream.sample_stream import SampleStream
from tests.paths import ROOT

DOC = ROOT / "docs" / "architecture.md"


@pytest.fixture(scope="module")
def doc():
    """The examples' namespace; what they register (an algorithm, an episode, a task
    source) is unregistered afterwards, so later tests see the built-in kinds only."""
    from streamrl.algorithms import base as algorithms
    from streamrl.rollout.episodes import base as episodes
    from streamrl.sources import _KINDS

    registries = [algorithms._ALGORITHMS, episodes._EPISODES, _KINDS]
    saved = [dict(r) for r in registries]
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    namespace: dict = {}
    for block in blocks:
        if block.startswith(("import", "from")):  # definitions, not the call sketch
            code = [line for line in block.splitlines() if line.strip()]
            assert len(code) <= 30, f"examples stay within 30 lines:\n{block}"
            exec(compile(block, str(DOC), "exec"), namespace)
    yield namespace
    for registry, before in zip(registries, saved, strict=True):
        registry.clear()
        registry.update(before)


# 2 RL steps of 2 items: 4 items consumed
TWO_STEPS = [
    "algorithm.dynamic_sampling=false",
    "rollout.group_size=2",
    "rollout.max_new_tokens=3",
    "train.items_per_step=2",
    "train.steps=2",
]


def test_algorithm_example_trains_its_critic(doc, tiny_config, monkeypatch) -> None:
    cls, built = doc["CriticBaseline"], []
    original = cls.setup

    def setup(self, trainer, tokenizer):  # only the trainer side calls setup
        built.append(self)
        original(self, trainer, tokenizer)

    monkeypatch.setattr(cls, "setup", setup)
    result = train(tiny_config(*TWO_STEPS, "algorithm.name=doc_critic_baseline"))
    assert result.summary["stream/consumed"] == 4
    (algo,) = built
    assert algo.state_dict()["critic_opt"]["state"]  # the critic took optimizer steps


def test_episode_example_runs_in_training_and_evaluation(doc, tiny_config) -> None:
    result = train(tiny_config(*TWO_STEPS, "rollout.episode=doc_answer_then_check"))
    rows = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    counted = [r for r in rows if "check/turns" in r]
    assert counted and all(r["check/turns"] == 2.0 for r in counted)  # a mean per episode


def test_task_source_example(doc, tiny_config) -> None:
    src = build_task_source("doc_parity")
    item = next(src.train_iter(0))
    assert item.answer in ("yes", "no") and len(src.heldout(5)) == 5
    heldout = {it.id for it in src.heldout()}
    assert not any(next(src.train_iter(s)).id in heldout for s in range(20))
    cfg = tiny_config(
        *TWO_STEPS,
        "data.kind=doc_parity",
        "data.options={}",
        "reward.components=[{name: exact_match}]",
        "reward.correct_reward=exact_match",
    )
    assert train(cfg).summary["stream/consumed"] == 4


def test_task_source_example_runs_from_the_documented_command(
    tmp_path: Path, tiny_config, monkeypatch, capsys
) -> None:
    """The task source block saved as the module the doc names, then the doc's own
    command through the CLI (with the tiny-run overrides): --import finds the module in
    the current directory, the run's config records it, and a wrong option fails first."""
    from streamrl.cli.main import main
    from streamrl.sources import _KINDS

    text = DOC.read_text()
    section = text[text.index("## How to add a task source") :]
    block = re.search(r"```python\n(.*?)```", section, re.S)[1]
    command = re.search(r"```bash\n(.*?)```", section, re.S)[1].replace("\\\n", " ")
    argv = shlex.split(command)
    module = argv[argv.index("--import") + 1]
    (tmp_path / f"{module}.py").write_text(block)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    kinds = dict(_KINDS)
    _KINDS.pop("doc_parity", None)  # (the `doc` fixture may have registered its own copy)
    try:
        assert argv[:2] == ["streamrl", "train"]
        out = tmp_path / "runs"
        code = main([*argv[1:], *tiny_config.args(*TWO_STEPS, output_dir=out)])
        assert code == 0, capsys.readouterr().err
        (run,) = out.iterdir()
        saved = yaml.safe_load((run / "config.yaml").read_text())
        assert saved["plugins"] == [module] and saved["data"]["options"] == {"limit": 1000}
        assert json.loads((run / "summary.json").read_text())["stream/consumed"] == 4
        bad = [a.replace("limit: 1000", "limit: many") for a in argv[1:]]
        assert main([*bad, *tiny_config.args(*TWO_STEPS, output_dir=tmp_path / "bad")]) == 2
        err = capsys.readouterr().err
        assert "command-line override: data.options.limit: Input should be a valid integer" in err
        assert not (tmp_path / "bad").exists()
        assert main(["train", "--import", "no_such_plugin", "sft.steps=0"]) == 2
        assert "--import: plugins[0]: cannot import 'no_such_plugin'" in capsys.readouterr().err
    finally:
        sys.modules.pop(module, None)
        _KINDS.clear()
        _KINDS.update(kinds)


def test_backend_example_serves_the_pool(doc, tiny_config) -> None:
    cfg = tiny_config(*TWO_STEPS)
    model, tokenizer = load_model_and_tokenizer("tiny-small", seed=0)
    spec = WorkerSpec(rollout_spec(cfg), model.config, tokenizer)
    backend = doc["OneThreadBackend"](spec, model.state_dict())
    stream = SampleStream(items_per_batch=2, max_staleness=0)
    pool = RolloutPool(backend, stream, build_task_source("arithmetic").train_iter(0))
    pool.start()
    try:
        pool.wait_version(0, timeout=60)
        groups = None
        while groups is None:
            pool.raise_if_failed()
            groups = stream.get_batch(timeout=1.0)
    finally:
        pool.stop()
        stream.close()
    assert [len(g.trajectories) for g in groups] == [2, 2]
