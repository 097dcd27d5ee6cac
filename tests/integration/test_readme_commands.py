"""Every command of the README's "Command line" block, through the real command line
(a subprocess, as a user types it) with its defaults: only sizes shrink (steps, held-out
items, prompts, episodes), never a key that picks a code path (``runtime.lend_cores``,
the backend, the placement...). One sweep of two tiny seeds feeds eval, compare (both
kinds), plot and log-completions; one ``streamrl train`` run feeds ``--resume``.

A command added to the README without a test here fails
:func:`test_every_readme_command_is_tested`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.paths import ROOT

ROOT = ROOT
README = ROOT / "README.md"
# sizes only. dynamic_sampling: with 2 SFT steps every sample is wrong, so the default
# filter would drop every group (the run then stops: nothing to learn)
SMALL = [
    "sft.steps=2",
    "train.steps=3",
    "eval.heldout_size=20",
    "algorithm.dynamic_sampling=false",
]
TESTED = {  # README command -> the test that runs it
    "train": "test_train_and_resume",
    "train --resume": "test_train_and_resume",
    "eval": "test_eval_compare_plot_and_log_completions",
    "compare": "test_eval_compare_plot_and_log_completions",
    "serve": "test_serve_answers_and_stops_promptly_on_sigterm",
    "sandbox run": "test_sandbox_run_config_and_reference",
    "data make-minari": "test_make_minari",
    "data log-completions": "test_eval_compare_plot_and_log_completions",
    "sweep": "test_eval_compare_plot_and_log_completions",
    "plot": "test_eval_compare_plot_and_log_completions",
    "config": "test_sandbox_run_config_and_reference",
    "config --reference": "test_sandbox_run_config_and_reference",
    "python -m streamrl.recipes.grpo": "test_grpo_recipe",
}


def readme_commands() -> set[str]:
    """The commands of the README's "Command line" block: the words after ``streamrl``
    up to the first argument (a literal ``--flag`` right after them belongs to the
    command), or the ``python -m`` module."""
    section = README.read_text().split("## Command line", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    found = set()
    for line in block.splitlines():
        words = line.split("#")[0].split()
        if words[:2] == ["python", "-m"]:
            found.add(" ".join(words[:3]))
            continue
        assert words[0] == "streamrl", line
        key = []
        for w in words[1:]:
            if not re.fullmatch(r"[a-z][a-z-]*|--[a-z-]+", w) or (w[0] == "-" and not key):
                break
            key.append(w)
        found.add(" ".join(key))
    return found


def test_every_readme_command_is_tested() -> None:
    commands = readme_commands()
    assert {"train", "serve", "sweep", "config --reference"} <= commands  # the parser works
    untested = commands - set(TESTED)
    assert not untested, f"README commands without a test in {__name__}: {sorted(untested)}"
    assert set(TESTED.values()) <= set(globals()), "a TESTED entry names no test"


def streamrl(*args: str, cwd: Path, timeout: float = 600, module: str = "streamrl.cli.main"):
    """Runs ``python -m streamrl.cli.main ARGS`` (the ``streamrl`` script's entry point) with
    this checkout first on the path; returns the completed process."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def sweep_runs(tmp_path_factory) -> Path:
    """``streamrl sweep examples/default.yaml --seeds 0 1``: two runs, evaluated every
    step (``sigmoid`` fits need four evaluations)."""
    out = tmp_path_factory.mktemp("sweep") / "runs"
    config = str(ROOT / "examples" / "default.yaml")
    args = ["sweep", config, "--seeds", "0", "1", *SMALL, "eval.every=1"]
    stdout = ok(streamrl(*args, f"run.output_dir={out}", cwd=out.parent))
    assert f"streamrl compare {out / 'default-s0'} {out / 'default-s1'}" in stdout
    return out


@pytest.mark.slow
def test_eval_compare_plot_and_log_completions(sweep_runs: Path, tmp_path: Path) -> None:
    run = sweep_runs / "default-s0"
    assert summary(run)["status"] == "completed"
    # eval: greedy on the run's held-out items (pass@k: tests/integration/test_eval_cli.py)
    ok(streamrl("eval", str(run), "--out", str(tmp_path / "greedy.json"), cwd=tmp_path))
    greedy = json.loads((tmp_path / "greedy.json").read_text())["metrics"]
    assert greedy["n_items"] == 20 and greedy["n_samples"] == 1 and "accuracy" in greedy
    # compare: the statistics, and the sigmoid fit
    stdout = ok(
        streamrl("compare", str(sweep_runs), "--metric", "eval_accuracy_after", cwd=tmp_path)
    )
    assert "eval_accuracy_after" in stdout
    fit = tmp_path / "fit"
    ok(streamrl("compare", str(sweep_runs), "--fit", "sigmoid", "--out", str(fit), cwd=tmp_path))
    assert (fit / "fit.md").is_file() and (fit / "sigmoid_fit.png").is_file()
    # plot
    png = tmp_path / "curves.png"
    ok(streamrl("plot", str(run), "--out", str(png), cwd=tmp_path))
    assert png.stat().st_size > 1000
    # data log-completions, with preference pairs
    rows, pairs = tmp_path / "completions.jsonl", tmp_path / "pairs.jsonl"
    args = ["--out", str(rows), "--n", "4", "--prompts", "8", "--preferences", str(pairs)]
    ok(streamrl("data", "log-completions", str(run), *args, cwd=tmp_path))
    logged = [json.loads(line) for line in rows.read_text().splitlines()]
    assert len(logged) == 32 and {"prompt", "completion", "reward"} <= set(logged[0])
    assert pairs.is_file()


@pytest.mark.slow
def test_train_and_resume(tmp_path: Path) -> None:
    """``streamrl train`` with no config file (the built-in defaults), stopped by SIGTERM
    once RL has its first checkpoint, then ``--resume`` to the end; a second ``--resume``
    of the finished run says so and changes nothing."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    args = ["train", *SMALL, "train.steps=40", f"run.output_dir={tmp_path}"]
    run = tmp_path / "default"
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli.main", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not list(run.glob("checkpoints/rl-*")) and proc.poll() is None:
            assert time.monotonic() < deadline, "no RL checkpoint within 300 s"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, f"exit {proc.returncode}\n{out}\n{err}"
    assert summary(run)["status"] == "interrupted"
    assert f"streamrl train --resume {run}" in out + err
    stdout = ok(streamrl("train", "--resume", str(run), cwd=tmp_path))
    assert f"run directory: {run}" in stdout and "held-out greedy accuracy" in stdout
    done = summary(run)
    assert done["status"] == "completed" and done["steps"] == 40
    assert (run / "model" / "config.json").is_file()  # run.save_weights: the default
    assert done["stream/consumed"] == 40 * 16  # train.items_per_step: nothing lost or redone
    before = (run / "summary.json").read_bytes()
    stdout = ok(streamrl("train", "--resume", str(run), cwd=tmp_path))
    assert "nothing to resume" in stdout
    assert (run / "summary.json").read_bytes() == before


@pytest.mark.slow
def test_grpo_recipe(tmp_path: Path) -> None:
    args = [*SMALL, f"run.output_dir={tmp_path}"]
    ok(streamrl(*args, cwd=tmp_path, module="streamrl.recipes.grpo"))


def test_sandbox_run_config_and_reference(tmp_path: Path) -> None:
    program = tmp_path / "hello.py"
    program.write_text("print(6 * 7)\n")
    result = json.loads(ok(streamrl("sandbox", "run", str(program), cwd=tmp_path)))
    assert result["exit_code"] == 0 and result["stdout"].strip() == "42"
    config = yaml.safe_load(ok(streamrl("config", cwd=tmp_path)))
    assert config["runtime"]["lend_cores"] is True and config["train"]["steps"] == 200
    reference = ok(streamrl("config", "--reference", cwd=tmp_path))
    assert "| `endpoint.max_body_bytes` |" in reference


def test_make_minari(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    args = ["CartPole-v1", "--policy", "random", "--episodes", "3", "--dataset-id", "cp/r-v0"]
    stdout = ok(streamrl("data", "make-minari", *args, cwd=tmp_path))
    assert json.loads(stdout)["episodes"] == 3
    assert (tmp_path / "datasets").is_dir()


@pytest.mark.slow
def test_serve_answers_and_stops_promptly_on_sigterm(tmp_path: Path) -> None:
    """``streamrl serve`` with no config file: it serves and trains (runtime.lend_cores on:
    the trainer drives the endpoint's engine), and SIGTERM while sessions wait for
    admission refuses them (503), checkpoints and exits with 128 + 15."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    sizes = ["train.items_per_step=1", "eval.heldout_size=10"]
    args = ["serve", f"run.output_dir={tmp_path}", "run.name=srv", *sizes]
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli.main", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        run = tmp_path / "srv"
        for _ in range(2400):
            if (run / "endpoint.json").exists():
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        info = json.loads((run / "endpoint.json").read_text())
        base, token = info["base_url"], Path(info["token_file"]).read_text()
        client = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
        auth = {"Authorization": f"Bearer {token}"}
        assert [m.id for m in client.models.list()] == ["tiny"]

        def chat(session: str) -> httpx.Response:
            body = {"messages": [{"role": "user", "content": "12+30="}], "session_id": session}
            return httpx.post(f"{base}/chat/completions", json=body, headers=auth, timeout=120)

        # one session, rewarded: RL step 1 trains on it
        reply = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "12+30="}],
            n=2,
            extra_body={"session_id": "a"},
        )
        assert len(reply.choices) == 2
        url = f"{base}/sessions/a/reward"
        assert httpx.post(url, json={"rewards": [1, 0]}, headers=auth).status_code == 200
        for _ in range(2400):
            rows = (run / "metrics.jsonl").read_text().splitlines()
            if any(json.loads(r)["step"] == 1 for r in rows):
                break
            time.sleep(0.05)
        # eta = 1, one item per step: two sessions are admitted at version 1, a third waits
        replies: dict[str, httpx.Response] = {}
        callers = [
            threading.Thread(target=lambda s=s: replies.setdefault(s, chat(s))) for s in "bcd"
        ]
        for t in callers:
            t.start()
        for _ in range(2400):
            if len(replies) >= 2:
                break
            time.sleep(0.05)
        assert sorted(r.status_code for r in replies.values()) == [200, 200]
        (waiting,) = set("bcd") - set(replies)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
        for t in callers:
            t.join(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert replies[waiting].status_code == 503
    assert "the run has ended" in replies[waiting].json()["error"]["message"]
    assert "interrupted during RL at step 1" in stderr
    assert summary(run)["status"] == "interrupted"
    assert "1 session(s) waiting for admission refused" in (run / "run.log").read_text()
