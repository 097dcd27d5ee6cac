"""Config loading: defaults, YAML, dotted overrides, and errors that name the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from streamrl.config import RENAMED_KEYS, ConfigError, load_config, parse_override, save_config
from tests.paths import ROOT


def test_defaults_are_valid() -> None:
    cfg = load_config()
    assert cfg.model.name_or_path == "tiny"
    assert cfg.stream.max_staleness == 1


def test_yaml_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text('train:\n  steps: 7\n  lr: 0.01\nrollout:\n  stop: ["\\n"]\n')
    cfg = load_config(path, ["train.steps=9", "rollout.temperature=0.5", "data.options.digits=3"])
    assert cfg.train.steps == 9 and cfg.train.lr == 0.01
    assert cfg.rollout.temperature == 0.5 and cfg.rollout.stop == ["\n"]
    assert cfg.data.options["digits"] == 3


def test_round_trip(tmp_path: Path) -> None:
    cfg = load_config(None, ["seed=3", "algorithm.name=rloo"])
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg


def test_unknown_key_names_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  steps: 5\n  learning_rate: 0.1\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert f"{path}:3: train.learning_rate: unknown key" in str(e.value)


def test_wrong_type_names_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("seed: 1\nrollout:\n  group_size: many\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    msg = str(e.value)
    assert f"{path}:3: rollout.group_size" in msg and "'many'" in msg


def test_bad_override_is_named() -> None:
    with pytest.raises(ConfigError, match=r"command-line override: train.stepz: unknown key"):
        load_config(None, ["train.stepz=3"])
    with pytest.raises(ConfigError, match=r"stream.max_staleness: Input should be greater"):
        load_config(None, ["stream.max_staleness=-1"])
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        parse_override("train.steps")


def test_cross_field_check() -> None:
    from streamrl.run.preflight import PreflightError, preflight

    with pytest.raises(PreflightError, match="correct_reward"):
        preflight(load_config(None, ["reward.correct_reward=nope"]), output_dir=False)


def test_invalid_yaml_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(path)
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")


def test_defaults_are_the_main_job() -> None:
    """`streamrl train` with no file runs examples/default.yaml, the README's main job."""
    root = ROOT
    documented = load_config(root / "examples" / "default.yaml")
    assert load_config() == documented
    assert load_config().sft.steps > 0 and load_config().model.name_or_path == "tiny"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("train.batch_size", "train.items_per_step"),
        ("train.micro_batch_size", "train.micro_batch_sequences"),
        ("sft.batch_size", "sft.examples_per_step"),
        ("rollout.max_batch_size", "rollout.decode_slots"),
        ("stream.max_inflight_groups", "stream.max_inflight_items"),
    ],
)
def test_renamed_keys_name_their_new_name(tmp_path: Path, old: str, new: str) -> None:
    with pytest.raises(ConfigError, match=rf"override: {old}: renamed to {new}"):
        load_config(None, [f"{old}=4"])
    section, key = old.split(".")
    path = tmp_path / "old.yaml"
    path.write_text(f"seed: 1\n{section}:\n  {key}: 4\n")
    with pytest.raises(ConfigError, match=rf"{path}:3: {old}: renamed to {new}"):
        load_config(path)


def test_duplicate_yaml_key_names_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("train:\n  steps: 5\n  lr: 0.1\n  steps: 6\n")
    with pytest.raises(ConfigError, match=rf"{path}:4: train.steps: duplicate key .*line 2"):
        load_config(path)


def test_override_typo_is_blamed_on_the_override_not_the_file(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("train:\n  steps: 5\n")
    with pytest.raises(ConfigError, match="command-line override: trian: unknown key"):
        load_config(path, ["trian.steps=5"])


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED_KEYS.items()))
def test_every_renamed_key_names_its_new_key_which_exists(old: str, new: str) -> None:
    with pytest.raises(
        ConfigError, match=rf"override: {re.escape(old)}: renamed to {re.escape(new)}"
    ):
        load_config(None, [f"{old}=1"])
    for target in re.findall(r"[a-z0-9_]+(?:\.[a-z0-9_]+)+", new):  # the new key(s) it names
        node = load_config()
        for part in target.split("."):
            node = getattr(node, part)  # an AttributeError: a dangling new name


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("algorithm.advantage", "algorithm.name"),
        ("algorithm.kl_coef", "algorithm.kl.coef"),
        ("algorithm.is_correction", "algorithm.correction.kind"),
        ("algorithm.gae_lambda", "algorithm.ppo.gae_lambda"),
        ("algorithm.rho_bar", "algorithm.vtrace.rho_bar"),
        ("algorithm.q_hidden", "algorithm.offline.q_hidden"),
    ],
)
def test_the_flat_algorithm_keys_name_their_nested_home(tmp_path: Path, old: str, new: str) -> None:
    section, key = old.split(".")
    path = tmp_path / "old.yaml"
    path.write_text(f"seed: 1\n{section}:\n  {key}: 4\n")
    with pytest.raises(ConfigError, match=rf"{path}:3: {old}: renamed to {new} \(got 4\)"):
        load_config(path)


@pytest.mark.parametrize(("old", "new"), [("gae", "ppo"), ("vtrace", "appo")])
def test_an_algorithm_name_that_changed_names_its_new_spelling(old: str, new: str) -> None:
    with pytest.raises(
        ConfigError,
        match=rf"algorithm\.advantage: renamed to algorithm\.name, and '{old}' to '{new}': "
        rf"algorithm\.name: {new} \(got '{old}'\)",
    ):
        load_config(None, [f"algorithm.advantage={old}"])
    with pytest.raises(ConfigError, match=rf"algorithm\.name: '{old}' is now called '{new}'"):
        load_config(None, [f"algorithm.name={old}"])
    assert load_config(None, [f"algorithm.name={new}"]).algorithm.name == new


def test_each_family_keeps_its_settings_under_its_name() -> None:
    cfg = load_config(
        None,
        [
            "algorithm.name=appo",
            "algorithm.ppo.gamma=0.9",
            "algorithm.vtrace.c_bar=0.5",
            "algorithm.offline.gamma=0.5",
            "algorithm.kl.coef=0.1",
            "algorithm.correction.kind=tis",
        ],
    )
    a = cfg.algorithm
    assert (a.name, a.ppo.gamma, a.vtrace.c_bar, a.offline.gamma) == ("appo", 0.9, 0.5, 0.5)
    assert (a.kl.coef, a.correction.kind, a.correction.cap) == (0.1, "tis", 2.0)
