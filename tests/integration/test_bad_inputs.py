"""The bad-input corpus (tests/bad_inputs/): every user error gives one line naming the
file, line or key, with no traceback, and writes nothing or a run marked failed."""

from __future__ import annotations

import json
import re
import socket
import types
import typing
from pathlib import Path

import pytest
import torch
from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel

from streamrl.cli.main import main
from streamrl.config import Config, ConfigError, load_config
from tests.paths import TESTS

CORPUS = TESTS / "bad_inputs"
CASES = sorted(CORPUS.glob("*.yaml"))


def _header(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if m := re.match(r"# (expect|writes|needs): (.*)", line):
            out[m[1]] = m[2]
    return out


def _run(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err


def _one_error_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def _check_written(out: Path, writes: str) -> None:
    runs = [p for p in out.iterdir() if p.is_dir()] if out.exists() else []
    if writes == "nothing":
        assert runs == [], f"a run directory was written: {runs}"
    else:
        (run,) = runs
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "failed" and summary["error"], summary


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_corpus_case(case: Path, tmp_path: Path, capsys) -> None:
    header = _header(case)
    if header.get("needs") == "no-cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    config = tmp_path / case.name
    config.write_text(case.read_text().replace("{corpus}", str(CORPUS)))
    out = tmp_path / "runs"
    argv = ["train", str(config)]
    if "output_dir" not in config.read_text():
        argv.append(f"run.output_dir={out}")
    code, err = _run(argv, capsys)
    assert code == 2, err
    line = _one_error_line(err)
    assert re.search(header["expect"], line), f"{line!r} !~ {header['expect']!r}"
    _check_written(out, header["writes"])


def test_failures_reach_the_console_rate_limited(tmp_path: Path, capsys, caplog) -> None:
    config = tmp_path / "c.yaml"
    case = CORPUS / "rewards_always_fail.yaml"
    config.write_text(case.read_text().replace("{corpus}", str(CORPUS)))
    _run(["train", str(config), f"run.output_dir={tmp_path / 'runs'}"], capsys)
    shown = [r.getMessage() for r in caplog.records if r.name == "streamrl.failures"]
    # 20 failed items, but at most one console line per 10 s
    assert 1 <= len(shown) <= 2 and "reward_error:numeric_match" in shown[0], shown


def test_output_dir_that_is_a_file_or_read_only(tmp_path: Path, capsys) -> None:
    afile = tmp_path / "file"
    afile.write_text("x")
    code, err = _run(["train", f"run.output_dir={afile}", "sft.steps=0"], capsys)
    assert code == 2 and f"run.output_dir={afile}: cannot create a run directory" in err
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if (ro / "probe").exists() or _writable(ro):
            pytest.skip("running as a user who can write anywhere (root)")
        code, err = _run(["train", f"run.output_dir={ro}"], capsys)
        assert code == 2 and f"run.output_dir={ro}" in _one_error_line(err)
    finally:
        ro.chmod(0o700)


def _writable(path: Path) -> bool:
    try:
        (path / ".w").write_text("")
    except OSError:
        return False
    (path / ".w").unlink()
    return True


@pytest.mark.slow
@pytest.mark.parametrize("listener", ["closed", "silent"])
def test_unreachable_ray_address_fails_fast_with_one_line(tmp_path: Path, capsys, listener) -> None:
    pytest.importorskip("ray")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    if listener == "silent":
        sock.listen()  # accepts the connection, never answers
    else:
        sock.close()  # nothing listens on this loopback port
    try:
        code, err = _run(
            [
                "train",
                "runtime.backend=ray",
                f"runtime.ray_address=127.0.0.1:{port}",
                f"run.output_dir={tmp_path}",
            ],
            capsys,
        )
    finally:
        sock.close()
    line = _one_error_line(err)
    assert code == 2 and f"runtime.ray_address='127.0.0.1:{port}'" in line, line
    assert list(tmp_path.iterdir()) == []


def test_eval_on_a_run_without_weights_says_so(tmp_path: Path, capsys) -> None:
    (tmp_path / "config.yaml").write_text("seed: 0\n")
    code, err = _run(["eval", str(tmp_path)], capsys)
    assert code == 2 and "without model/" in _one_error_line(err)


# ------------------------------------------------------------ every config key


def _keys() -> list[tuple[str, typing.Any]]:
    out = []
    for name, field in Config.model_fields.items():
        section = field.annotation
        if isinstance(section, type) and issubclass(section, BaseModel):
            out += [(f"{name}.{k}", f) for k, f in section.model_fields.items()]
        else:
            out.append((name, field))
    return out


def _wrong_type(annotation: typing.Any) -> str:
    """A YAML value of a type the field does not accept."""
    text = str(annotation)
    if "dict" in text:
        return "[1, 2]"
    if "list" in text:
        return "{a: 1}"  # (a lone text where a list of texts goes is taken as one)
    if annotation is bool or "bool" in text:
        return "{a: 1}"
    if annotation is str or "Literal" in text or text == "str | None":
        return "{a: 1}"
    return "not-a-number"


@pytest.mark.parametrize("key,field", _keys(), ids=[k for k, _ in _keys()])
def test_every_key_rejects_a_wrong_type_and_out_of_range_values(key: str, field) -> None:
    with pytest.raises(ConfigError, match=rf"command-line override: {re.escape(key)}: "):
        load_config(None, [f"{key}={_wrong_type(field.annotation)}"])
    for bound in field.metadata:  # pydantic's ge / gt / le / lt constraints
        if isinstance(bound, Ge):
            bad = bound.ge - 1
        elif isinstance(bound, Gt):
            bad = bound.gt
        elif isinstance(bound, Le):
            bad = bound.le + 1
        elif isinstance(bound, Lt):
            bad = bound.lt
        else:
            continue
        with pytest.raises(ConfigError, match=rf"{re.escape(key)}: Input should be"):
            load_config(None, [f"{key}={bad}"])


# ------------------------------------------------------------ every field, by class


def _all_fields(model: type[BaseModel], prefix: tuple[str, ...] = ()):
    """(key path, annotation) of every field, sub-models and lists of them included (a
    list of models is entered at its element 0)."""
    for name, field in model.model_fields.items():
        path, ann = (*prefix, name), field.annotation
        args = typing.get_args(ann)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _all_fields(ann, path)
        elif typing.get_origin(ann) is list and args and issubclass(args[0], BaseModel):
            yield from _all_fields(args[0], (*path, "0"))
        else:
            yield path, ann


def _override(path: tuple[str, ...], value: str) -> str:
    """``key=value``, or for a field of reward.components[0] the whole list."""
    if "0" in path:
        i = path.index("0")
        name = "" if path[i + 1] == "name" else "name: numeric_match, "
        return f"{'.'.join(path[:i])}=[{{{name}{path[i + 1]}: {value}}}]"
    return f"{'.'.join(path)}={value}"


def _non_finite_cases() -> list[tuple[str, str]]:
    """(override, key the error names) for NaN and infinities in every field that holds a
    float: typed floats, lists of them, and free-form dictionaries (options)."""
    cases = []
    for path, ann in _all_fields(Config):
        text, key = str(ann), ".".join(path)
        if typing.get_origin(ann) is typing.Literal:
            continue
        if typing.get_origin(ann) is dict or ann is dict:
            values = typing.get_args(ann)[1:] or [typing.Any]
            if values[0] is typing.Any or any(t in str(values[0]) for t in ("Any", "float")):
                cases.append((_override(path, "{x: {y: .nan}}"), f"{key}.x.y"))
        elif "list[float]" in text:
            cases.append((_override(path, "[.inf, 1.0]"), f"{key}.0"))
        elif ann is float or "float" in text:
            cases += [(_override(path, v), key) for v in (".nan", "-.inf", "nan", "inf")]
    return cases


NON_FINITE = _non_finite_cases()


def test_the_non_finite_cases_cover_every_kind_of_float_field() -> None:
    keys = {key for _, key in NON_FINITE}
    for key in (
        "reward.components.0.weight",
        "reward.components.0.options.x.y",
        "algorithm.correction.icepop_band.0",
        "rollout.vllm.gpu_memory_utilization",
        "data.options.x.y",
        "agent.tool_options.x.y",
        "model.options.x.y",
        "run.stop_at_eval",  # float | None
        "train.lr",
    ):
        assert key in keys, key
    assert len(keys) >= 55  # (58 when written)


@pytest.mark.parametrize("override,key", NON_FINITE, ids=[o for o, _ in NON_FINITE])
def test_every_float_field_rejects_nan_and_infinity(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}: Input should be a finite number"):
        load_config(None, [override])


# YAML 1.1 reads these plain scalars as booleans, numbers and dates
TYPED_TEXT = ["off", "no", "yes", "on", "12:30", "1e3", "1.5", "017", "0x1F", "2024-01-01"]


def _text_fields() -> list[tuple[tuple[str, ...], bool]]:
    """(key path, is a list of text) of every field that holds text."""
    from streamrl.config.reading import takes_str

    out = []
    for path, ann in _all_fields(Config):
        inner = [a for a in typing.get_args(ann) if a is not type(None)] or [ann]
        if takes_str(ann):
            out.append((path, False))
        elif typing.get_origin(inner[0]) is list and typing.get_args(inner[0]) == (str,):
            out.append((path, True))
    return out


TEXT_FIELDS = _text_fields()


@pytest.mark.parametrize("path,is_list", TEXT_FIELDS, ids=[".".join(p) for p, _ in TEXT_FIELDS])
def test_every_text_field_takes_what_was_typed(path: tuple[str, ...], is_list: bool) -> None:
    """A text field gets the user's text, or an error quoting it (a Literal, a name
    rule): never YAML 1.1's boolean, number or date."""
    for text in TYPED_TEXT:
        value = f"[{text}]" if is_list else text
        try:
            cfg = load_config(None, [_override(path, value)])
        except ConfigError as e:
            assert f"(got '{text}')" in str(e) or f"(got ['{text}'])" in str(e), str(e)
            continue
        got = cfg
        for part in path:
            got = got[int(part)] if part == "0" else getattr(got, part)
        assert got == ([text] if is_list else text), (path, text, got)


def test_text_fields_in_a_file_take_what_was_typed(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("run: {name: off, wandb_project: 12:30}\nrollout: {stop: [no, 1e3]}\n")
    cfg = load_config(path)
    assert (cfg.run.name, cfg.run.wandb_project, cfg.rollout.stop) == (
        "off",
        "12:30",
        ["no", "1e3"],
    )
    assert load_config(None, ["run.name=null"]).run.name is None  # a null stays a null


@pytest.mark.parametrize("name", ["../x", "/abs", "a/b", "..", ".", "a\\b", "", "a\x00b"])
def test_run_name_is_one_directory_name(name: str) -> None:
    with pytest.raises(ValueError, match=r"run\.name\n?.*expected a"):
        Config.model_validate({"run": {"name": name}})
    if "\x00" not in name:  # (YAML refuses a NUL before any field sees it)
        with pytest.raises(ConfigError, match=r"run\.name: expected a"):
            load_config(None, [f"run.name='{name}'"])


def test_run_name_cannot_escape_the_output_dir(tmp_path: Path, capsys) -> None:
    out = tmp_path / "runs"
    code, err = _run(["train", "run.name=../escaped", f"run.output_dir={out}"], capsys)
    assert code == 2 and "run.name: expected a name without path separators" in err
    assert list(tmp_path.iterdir()) == []
    assert load_config(None, ["run.name=..a.b"]).run.name == "..a.b"  # a name, not '..'


# ------------------------------------------------------------ options, by class


def _wrong_value(ann: typing.Any) -> typing.Any:
    """A value of a type ``ann`` does not accept (None when every value is accepted)."""
    if typing.get_origin(ann) is typing.Literal:
        return "no-such-choice"
    union = typing.get_origin(ann) in (typing.Union, types.UnionType)
    kinds = [a for a in typing.get_args(ann) if a is not type(None)] if union else [ann]
    if all(typing.get_origin(k) in (dict, list) for k in kinds):
        return 5
    text = " ".join(str(k) for k in kinds)
    if "Any" in text or "Callable" in text:
        return None
    if all(k is str or k is Path for k in kinds):
        return [1, 2]
    if any(k is bool for k in kinds):
        return "maybe"
    if any(k in (int, float) for k in kinds):
        return "abc"
    return None


def _declared_options():
    from streamrl.config.options import _signature_model
    from streamrl.models.policies import PolicyOptions
    from streamrl.rollout.rewards.registry import _REWARDS
    from streamrl.sources import _KINDS

    sources = [(("data", "options"), f, kind, 0) for kind, f in _KINDS.items()]
    rewards = [(("options",), f, name, 2) for name, f in _REWARDS.items()]
    for where, factory, name, skip in sources + rewards:
        for key, info in _signature_model(factory, skip).model_fields.items():
            if (bad := _wrong_value(info.annotation)) is not None:
                yield where, name, key, bad
    for key, info in PolicyOptions.model_fields.items():
        yield ("model", "options"), "mlp", key, _wrong_value(info.annotation)


DECLARED = list(_declared_options())


def test_declared_options_cover_every_source_and_reward() -> None:
    names = {name for _, name, _, _ in DECLARED}
    sources = {"arithmetic", "jsonl", "parquet", "datasets", "mixture", "minari", "gym"}
    sources |= {"longtail", "tool_arithmetic", "reasoning_gym"}
    assert sources | {"numeric_match", "format_reward", "llm_judge", "reward_model", "mlp"} <= names


@pytest.mark.parametrize(
    "where,name,key,bad", DECLARED, ids=[f"{n}.{k}" for _, n, k, _ in DECLARED]
)
def test_every_declared_option_rejects_a_wrong_type(where, name, key, bad) -> None:
    """Task sources, rewards and policies: an option of the wrong type is an error
    naming its key path, before anything is built."""
    from streamrl.config.options import OptionsError, validate_options
    from streamrl.models.policies import PolicyOptions
    from streamrl.rollout.rewards import reward_options
    from streamrl.sources import task_source_options

    with pytest.raises(OptionsError, match=rf"(?m)^{re.escape('.'.join((*where, key)))}\b"):
        if where == ("data", "options"):
            task_source_options(name, {key: bad})
        elif where == ("options",):
            reward_options(name, {key: bad})
        else:
            validate_options(PolicyOptions, {key: bad}, where)


def test_options_are_converted_to_their_types_and_saved_so(tmp_path: Path) -> None:
    """Preflight writes the checked options back: the run directory's config holds what
    the run used (a quoted number for an int option is the int)."""
    from streamrl.run.preflight import preflight

    cfg = load_config(
        None,
        [
            "data.options={digits: '1', operators: '+'}",
            "model.name_or_path=tiny-small",
            "reward.components=[{name: numeric_match, options: {tol: '0.5'}}]",
            f"run.output_dir={tmp_path}",
        ],
    )
    inputs = preflight(cfg)
    inputs.reward.close()
    assert cfg.data.options == {"digits": 1, "operators": "+"}
    assert cfg.reward.components[0].options == {"tol": 0.5}


# ------------------------------------------------------------ prompts longer than the context


def test_prompts_too_long_are_counted_before_and_filtered_during_the_run(
    tmp_path: Path, tiny_config, capsys, caplog
) -> None:
    """A fifth of the prompts cannot fit the tiny model's 256 tokens: preflight says how
    many, the run filters each as prompt_too_long, and every issued item is accounted."""
    train = tmp_path / "train.jsonl"
    train.write_text(
        "".join(
            json.dumps({"prompt": ("9" * 300 if i % 5 == 0 else "") + f"{i}+1=", "answer": i + 1})
            + "\n"
            for i in range(40)
        )
    )
    heldout = tmp_path / "heldout.jsonl"
    prompts = ["101+1=", "102+1=", "103+1=", "8" * 300 + "+1="]
    heldout.write_text("".join(json.dumps({"prompt": p, "answer": 0}) + "\n" for p in prompts))
    out = tmp_path / "runs"
    argv = [
        "train",
        *tiny_config.args(
            "data.kind=jsonl",
            f"data.options={{path: '{train}', eval_path: '{heldout}'}}",
            "eval.samples=0",
            "train.steps=3",
            "train.items_per_step=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=3",
            "algorithm.dynamic_sampling=false",
            output_dir=out,
        ),
    ]
    code, err = _run(argv, capsys)
    assert code == 0, err
    said = [r.getMessage() for r in caplog.records if r.name == "streamrl.run.preflight"]
    assert any(m.startswith("8 of the 40 training prompts checked") for m in said), said
    assert any(m.startswith("1 of the 4 held-out prompts checked") for m in said), said
    (run,) = out.iterdir()
    s = json.loads((run / "summary.json").read_text())
    assert s["stream/filtered/prompt_too_long"] > 0
    assert s["stream/issued"] == s["stream/consumed"] + s["stream/filtered"] + s["stream/failed"]
    assert s["stream/consumed"] == 6
    # the long held-out prompt counts as an incorrect answer, its error recorded
    assert s["eval_accuracy_after"] <= 0.75


def test_a_stream_of_prompts_too_long_stops_the_run(tmp_path: Path, tiny_config, capsys) -> None:
    """Past the prompts preflight looks at, items whose prompt cannot fit are filtered in
    a row: the run stops at algorithm.max_dropped_in_a_row instead of spinning."""
    from streamrl.sources import _KINDS, ArithmeticTaskSource, register_task_source

    class ThenLong(ArithmeticTaskSource):
        def train_iter(self, seed):
            for i, item in enumerate(super().train_iter(seed)):
                if i >= 4:
                    item.prompt = "9" * 300 + item.prompt
                yield item

    register_task_source("then_long", ThenLong)
    try:
        out = tmp_path / "runs"
        argv = [
            "train",
            *tiny_config.args(
                "data.kind=then_long",
                "data.max_too_long_fraction=1.0",
                "eval.samples=0",
                "eval.heldout_size=2",
                "train.steps=5",
                "train.items_per_step=2",
                "rollout.group_size=2",
                "rollout.max_new_tokens=2",
                "stream.max_staleness=0",
                "algorithm.dynamic_sampling=false",
                "algorithm.max_dropped_in_a_row=5",
                output_dir=out,
            ),
        ]
        code, err = _run(argv, capsys)
    finally:
        del _KINDS["then_long"]
    assert code == 2
    assert "5 items in a row were filtered because their prompt leaves no room" in err
    _check_written(out, "failed")
