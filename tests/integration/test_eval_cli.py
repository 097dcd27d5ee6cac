"""`streamrl eval` on a model directory and a prompt file: pass@k and per-item outcomes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamrl.cli.main import main
from streamrl.models import load_model_and_tokenizer


def test_eval_model_dir_on_prompt_file_with_passk(tmp_path: Path) -> None:
    model, tokenizer = load_model_and_tokenizer("tiny-small", seed=0)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    prompts = tmp_path / "probe.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"{i}+1=", "answer": i + 1}) + "\n" for i in range(5))
    )
    out = tmp_path / "eval.json"
    code = main(
        [
            "eval",
            str(tmp_path / "model"),
            "--split",
            str(prompts),
            "--n",
            "4",
            "--k",
            "1",
            "2",
            "4",
            "--out",
            str(out),
            "rollout.max_new_tokens=3",
            # a random model is never right; "contains a digit" makes outcomes vary
            "reward.components=[{name: format_reward, options: {pattern: '(?s).*[0-9].*'}}]",
            "reward.correct_reward=format_reward",
        ]
    )
    assert code == 0
    result = json.loads(out.read_text())
    m = result["metrics"]
    assert m["n_items"] == 5 and m["n_samples"] == 4
    assert 0.0 <= m["pass@1"] <= m["pass@2"] <= m["pass@4"] <= 1.0
    assert abs(m["pass@1"] - m["avg@4"]) < 1e-9  # pass@1 is the mean correctness
    items = result["items"]
    assert [it["answer"] for it in items] == [str(i + 1) for i in range(5)]
    assert all(len(it["completions"]) == 4 and len(it["correct"]) == 4 for it in items)
    # the JSON is enough to redo the analysis: pass@4 from the stored outcomes
    redo = sum(any(it["correct"]) for it in items) / len(items)
    assert abs(redo - m["pass@4"]) < 1e-9


@pytest.mark.parametrize("argv", [["--n", "0"], ["--n", "-2"], ["--n", "x"], ["--k", "0"]])
def test_eval_counts_must_be_positive(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "tiny-small", *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert f"argument {argv[0]}: expected an integer >= 1 (got '{argv[1]}')" in err


def test_eval_says_which_k_it_leaves_out(tmp_path: Path, capsys) -> None:
    model, tokenizer = load_model_and_tokenizer("tiny-small", seed=0)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    prompts = tmp_path / "probe.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"{i}+1=", "answer": i}) + "\n" for i in range(3))
    )
    out = tmp_path / "eval.json"
    base = ["eval", str(tmp_path / "model"), "--split", str(prompts), "--out", str(out)]
    code = main([*base, "rollout.max_new_tokens=2", "--n", "2", "--k", "1", "4", "16"])
    err = capsys.readouterr().err
    assert code == 0 and "--k 4 ignored: larger than --n 2" in err and "--k 16 ignored" in err
    metrics = json.loads(out.read_text())["metrics"]
    assert "pass@1" in metrics and "pass@4" not in metrics
    assert main([*base, "--k", "4"]) == 2  # (--n 1): nothing left to estimate
    assert "error: --k 4: pass@k needs --n >= k (got --n 1)" in capsys.readouterr().err
