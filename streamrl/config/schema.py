"""Typed, validated configuration: one pydantic model per component.

A config is a YAML file plus dotted ``key=value`` overrides::

    streamrl train examples/smoke.yaml train.steps=20 rollout.temperature=0.8

Every field is typed and documented where it is declared. Unknown keys and wrong
types are rejected with a message naming the key (and the YAML line when the
value came from a file). Defaults run on a laptop CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, PrivateAttr, ValidationError, field_validator

from streamrl.config.distill import DistillConfig

# sections in their own modules: runtime, prompt selection, pre-RL stages (and the base)
from streamrl.config.options import check_path_component
from streamrl.config.plugins import PluginError, check_module_name, import_plugins
from streamrl.config.reading import ConfigSource, YamlDoc, YamlError, keep_raw_strings, read_yaml
from streamrl.config.rollout import AgentConfig, RolloutConfig
from streamrl.config.runtime import RuntimeConfig
from streamrl.config.selection import SelectionConfig
from streamrl.config.stages import ALoLConfig, DPOConfig, LRSchedule, SFTConfig, _Section
from streamrl.config.tinker import TinkerConfig


class ConfigError(ValueError):
    """A config problem, with the file, line and key when known."""


class ModelConfig(_Section):
    name_or_path: str = Field(
        "tiny",
        description="A built-in preset ('tiny', 'tiny-small'), 'smollm2-135m-instruct', "
        "a local HF directory, a cached hub id, or a .gguf file; for environments a policy "
        "('mlp', 'cnn') or a saved policy directory.",
    )
    gguf_file: str | None = Field(None, description="GGUF file name inside name_or_path.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Weights dtype."
    )
    lora_rank: int = Field(0, ge=0, description="LoRA rank; 0 trains all weights (needs peft).")
    lora_alpha: float = Field(16.0, gt=0, description="LoRA scaling alpha.")
    lora_targets: list[str] = Field(
        ["all-linear"],
        description="Modules that get LoRA adapters: name suffixes ([q_proj, v_proj]) or "
        "all-linear (every linear layer but the output head).",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Options of an environment policy (name_or_path: mlp | cnn): hidden "
        "(layer sizes), obs_norm (running observation normalisation), log_std (initial).",
    )

    @field_validator("lora_targets", mode="before")
    @classmethod
    def _one_target(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class DataConfig(_Section):
    kind: str = Field(
        "arithmetic",
        description="Registered task source kind: arithmetic, jsonl, parquet, datasets, "
        "reasoning_gym, longtail, or one added with register_task_source.",
    )
    options: dict[str, Any] = Field(
        default_factory=lambda: {"digits": 2, "operators": "+", "heldout_size": 500},
        description="Options for the task source (see README: Task sources), checked "
        "against the types its signature declares before the run starts. File sources "
        "(jsonl, parquet, datasets) take max_row_bytes: the most one row may take "
        "(default 8 MiB; a larger row is an error naming its file and line).",
    )
    max_too_long_fraction: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Before the run, the first 1000 training prompts and the held-out "
        "prompts are tokenized: one that leaves no room in the model's context for a "
        "generated token is filtered during the run (prompt_too_long; in evaluation, "
        "incorrect). More than this fraction of either, or all of them, fails the run.",
    )


class RewardComponent(_Section):
    name: str = Field(description="Registered reward function name, e.g. 'numeric_match'.")
    weight: float = Field(1.0, description="Weight of this component in the total reward.")
    options: dict[str, Any] = Field(default_factory=dict, description="Keyword options.")
    domains: list[str] | None = Field(
        None,
        description="Score only items of these domains (a mixture source's names); "
        "None: every item.",
    )


class RewardConfig(_Section):
    components: list[RewardComponent] = Field(
        default_factory=lambda: [RewardComponent(name="numeric_match")],
        description="Reward functions summed with their weights.",
    )
    correct_reward: str = Field(
        "numeric_match", description="Reward whose value >= 1 counts as a correct answer."
    )
    timeout_s: float = Field(5.0, gt=0, description="A reward running longer is a failure.")
    isolation: Literal["thread", "process"] = Field(
        "thread",
        description="'thread': rewards run in worker threads of the rollout process (fast; a "
        "hung reward is abandoned). 'process': in a pool of worker processes (pebble) that "
        "are killed and replaced on a timeout, crash (segfault) or memory-limit breach.",
    )
    memory_limit_mb: int | None = Field(
        2048,
        ge=64,
        description="isolation=process: how much address space a reward worker may grow "
        "beyond its size at start-up (a reward that leaks past it fails, and its worker is "
        "replaced); None = no limit.",
    )


class AlgorithmConfig(_Section):
    advantage: str = Field(
        "grpo",
        description="grpo | dr_grpo | rloo | reinforce_pp | remax | gae | vtrace | distill; on "
        "transitions (offline data, environments): bc | iql | td3_bc ...",
    )
    policy_loss: str = Field("ppo_clip", description="ppo_clip | gspo | cispo")
    clip_low: float = Field(0.2, ge=0, description="PPO lower clip epsilon.")
    clip_high: float = Field(0.28, ge=0, description="PPO upper clip epsilon (DAPO clip-higher).")
    agg_mode: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = Field(
        "token_mean", description="How per-token losses are averaged."
    )
    decoupled: bool = Field(
        True,
        description="Decoupled PPO (AReaL): clip against the proximal policy (current "
        "weights before the update), weight by pi_prox/pi_behave; gae: stale env steps.",
    )
    behave_imp_weight_cap: float | None = Field(
        None, description="Mask tokens whose pi_prox/pi_behave exceeds this."
    )
    is_correction: Literal["none", "tis", "mis", "icepop"] = Field(
        "none",
        description="Train/inference mismatch correction of the decoupled weight "
        "pi_prox/pi_behave: tis (truncate at is_cap), mis (mask above is_cap), icepop "
        "(mask outside icepop_band).",
    )
    is_cap: float = Field(2.0, gt=0, description="tis / mis: the importance weight's cap.")
    icepop_band: list[float] = Field(
        default_factory=lambda: [0.5, 2.0],
        min_length=2,
        max_length=2,
        description="icepop: [low, high] band of kept importance weights.",
    )
    kl_coef: float = Field(0.0, ge=0, description="KL penalty to a frozen reference model.")
    kl_kind: Literal["k1", "k2", "k3"] = Field("k3", description="KL estimator.")
    entropy_coef: float = Field(0.0, description="Entropy bonus coefficient.")
    dynamic_sampling: bool = Field(
        True, description="Drop groups whose rewards are all equal (counted) and refill."
    )
    max_dropped_in_a_row: int = Field(
        1000,
        ge=0,
        description="Dynamic sampling: stop the run with an error after this many generated "
        "groups in a row were dropped for equal rewards (the policy gets every sample right, "
        "or every one wrong: nothing to learn), with a console warning from 100 on; 0 = never.",
    )
    gamma: float = Field(0.99, ge=0, le=1, description="Discount (gae, vtrace).")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda (gae).")
    vf_coef: float = Field(0.5, ge=0, description="Value-loss weight (gae, vtrace).")
    vf_clip: float | None = Field(
        None,
        gt=0,
        description="Clip the new value within this of the old one (PPO's value "
        "clipping); None: an unclipped squared error.",
    )
    norm_advantages: bool = Field(
        True, description="Normalise advantages per minibatch (gae, vtrace)."
    )
    clip_schedule: Literal["constant", "linear"] = Field(
        "constant",
        description="Anneal the PPO clip range linearly to 0 over the run (gae, vtrace).",
    )
    rho_bar: float = Field(1.0, gt=0, description="V-trace importance-weight cap for values.")
    c_bar: float = Field(1.0, gt=0, description="V-trace trace-cutting cap.")
    # offline / TD algorithms on transitions (bc, iql, td3_bc); gamma is shared
    expectile: float = Field(
        0.7, gt=0, lt=1, description="iql: expectile tau of the value loss (0.5 = mean)."
    )
    awr_beta: float = Field(
        3.0, ge=0, description="iql: inverse temperature beta of the weights exp(beta A)."
    )
    awr_max_weight: float = Field(
        100.0, gt=0, description="iql: cap of the advantage weights exp(beta A)."
    )
    reward_scale: float = Field(
        1.0,
        gt=0,
        description="iql: rewards times this in the TD target (IQL's reward normalisation; "
        "beta acts on Q - V in these units, so rewards of large scale need < 1).",
    )
    target_tau: float = Field(
        0.005, gt=0, le=1, description="iql, td3_bc: Polyak rate of the target networks."
    )
    td3_alpha: float = Field(
        2.5, ge=0, description="td3_bc: alpha; the actor maximises alpha Q / mean|Q| - BC error."
    )
    policy_noise: float = Field(
        0.2,
        ge=0,
        description="td3_bc: std of the target policy smoothing noise, as a fraction of "
        "the action box's half-width.",
    )
    noise_clip: float = Field(
        0.5, ge=0, description="td3_bc: clip of the smoothing noise (same units)."
    )
    policy_delay: int = Field(
        2, ge=1, description="td3_bc: one actor and target update per this many critic updates."
    )
    q_hidden: list[int] = Field(
        default_factory=lambda: [256, 256],
        description="iql, td3_bc: hidden layer sizes of each Q-network (ReLU MLPs).",
    )
    distill: DistillConfig = Field(
        default_factory=DistillConfig,
        description="distill: on-policy distillation's teachers and signal (algorithm.distill.*).",
    )


class TrainConfig(_Section):
    steps: int = Field(200, ge=0, description="RL steps (one batch each).")
    items_per_step: int = Field(
        16,
        ge=1,
        description="Items (prompts) per RL step; each is rolled out "
        "rollout.group_size times, so a step trains on items_per_step * group_size sequences.",
    )
    num_minibatches: int = Field(1, ge=1, description="Optimizer steps per pass over a batch.")
    epochs: int = Field(
        1, ge=1, description="Passes over each batch (PPO epochs; environment policies)."
    )
    micro_batch_sequences: int = Field(
        64, ge=1, description="Sequences per forward/backward (gradient accumulation unit)."
    )
    compile: bool = Field(
        False,
        description="torch.compile the language model's decoder layers for training "
        "(dynamic shapes, one graph for every layer). SmolLM2 on one CPU thread: updates "
        "0.90-1.03x as long (0.95x per token in RL), after ~40 s of compiling in the first "
        "one, so it pays on long runs only (benchmarks/results/rl_step.md).",
    )
    lr: float = Field(1e-4, gt=0, description="AdamW peak learning rate for RL.")
    lr_schedule: LRSchedule = Field(
        "constant",
        description="RL learning-rate schedule after warm-up: constant, linear "
        "or cosine decay to min_lr_ratio * lr at the last optimizer step.",
    )
    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear warm-up from 0.")
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="Final learning rate of linear/cosine decay, as a fraction."
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")


class StreamConfig(_Section):
    max_staleness: int = Field(
        1, ge=0, description="eta: max trainer version minus oldest token version (0 = sync)."
    )
    max_inflight_items: int | None = Field(
        None,
        ge=1,
        description="Cap on items being generated at once (default: no cap beyond "
        "the staleness bound's (eta + 1) * train.items_per_step).",
    )


class EvalConfig(_Section):
    heldout_size: int = Field(500, ge=1, description="Held-out items for greedy evaluation.")
    every: int = Field(50, ge=0, description="Evaluate every N RL steps (0 = only before/after).")
    samples: int = Field(
        4,
        ge=0,
        description="Also sample N completions per held-out item at rollout.temperature and "
        "report their mean accuracy as eval/sampled_accuracy: the policy's own reliability, "
        "which RL optimises (0 = greedy only). Language tasks only: environments are "
        "evaluated by deterministic episodes.",
    )
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        description="Evaluation answer budget. Default: rollout.max_new_tokens "
        "(an item's metadata.max_new_tokens still overrides either).",
    )


class EndpointConfig(_Section):
    """The OpenAI-compatible endpoint for external agents (``streamrl serve``)."""

    enabled: bool = Field(
        False,
        description="Serve /v1/chat/completions and train on the recorded sessions "
        "instead of running rollout workers (`streamrl serve` sets it).",
    )
    host: str = Field("127.0.0.1", description="Interface to bind; loopback by default.")
    port: int = Field(0, ge=0, le=65535, description="TCP port (0: any free port).")
    session_timeout_s: float = Field(
        300.0, gt=0, description="A session idle this long without a reward is a failed item."
    )
    tool_parser: str = Field(
        "hermes", description="How tool calls are parsed from completions (see agent.tool_parser)."
    )
    max_body_bytes: int = Field(
        2 * 1024 * 1024,
        ge=1024,
        description="Largest request body; a larger one gets 413 before it is parsed.",
    )
    max_prompt_tokens: int | None = Field(
        None,
        ge=1,
        description="Longest rendered prompt of a call, in tokens (default: the model's "
        "context less one token); a longer one gets 400.",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        allow_inf_nan=False,
        description="A connection that has not sent a request's headers within this time "
        "is closed.",
    )
    read_timeout_s: float = Field(
        30.0,
        gt=0,
        allow_inf_nan=False,
        description="A request body that has not fully arrived within this time gets 408.",
    )


class RunConfig(_Section):
    name: str | None = Field(
        "default",
        description="Run directory name under output_dir (taken: -1, -2, ... appended); "
        "None: a name from the time and seed.",
    )
    output_dir: str = Field("runs", description="Parent directory of run directories.")
    tensorboard: bool = Field(True, description="Write TensorBoard events.")
    progress: bool = Field(True, description="Show a live progress bar.")
    save_weights: bool = Field(True, description="Save final weights (safetensors).")
    wandb: bool = Field(
        False, description="Also log to Weights & Biases (needs `pip install 'streamrl[wandb]'`)."
    )
    wandb_project: str = Field("streamrl", description="W&B project.")
    wandb_mode: Literal["online", "offline", "disabled"] = Field(
        "offline", description="W&B mode; offline runs are uploaded later with `wandb sync`."
    )
    mlflow: bool = Field(
        False, description="Also log to MLflow (needs `pip install 'streamrl[mlflow]'`)."
    )
    mlflow_tracking_uri: str | None = Field(
        None, description="MLflow tracking URI (default: a file store in RUN_DIR/mlruns)."
    )
    mlflow_experiment: str = Field("streamrl", description="MLflow experiment name.")
    checkpoint_every: int = Field(
        50,
        ge=0,
        description="Write a checkpoint every N SFT and RL steps (0 = only at the end of SFT, "
        "at a graceful stop and at the end of the run); `streamrl train --resume RUN_DIR` "
        "continues from the newest readable one.",
    )
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept (the newest).")
    stop_at_eval: float | None = Field(
        None,
        description="End RL early once a periodic evaluation (eval.every) reaches this "
        "held-out accuracy or mean return (time-to-threshold benchmarks).",
    )
    max_rl_seconds: float | None = Field(
        None,
        gt=0,
        description="End RL after the step during which this many seconds of RL wall time "
        "(counted across resumes) have passed; the final evaluation runs as usual "
        "(fixed wall-clock budget comparisons).",
    )

    @field_validator("name")
    @classmethod
    def _one_directory(cls, value: str | None) -> str | None:
        # it names a directory inside output_dir: never one elsewhere
        return None if value is None else check_path_component(value)


class Config(_Section):
    """The whole run. See each section for its fields."""

    plugins: list[str] = Field(
        default_factory=list,
        description="Python modules imported before the config is validated: they register "
        "task sources, rewards, episodes, algorithms or tools (`streamrl train --import "
        "MODULE` adds one; the current directory is searched first).",
    )
    seed: int = Field(0, ge=0, description="Seed for init, data order and sampling.")
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    stream: StreamConfig = Field(default_factory=StreamConfig)
    selection: SelectionConfig = Field(default_factory=SelectionConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    dpo: DPOConfig = Field(default_factory=DPOConfig)
    alol: ALoLConfig = Field(default_factory=ALoLConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    endpoint: EndpointConfig = Field(default_factory=EndpointConfig)
    tinker: TinkerConfig = Field(default_factory=TinkerConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    # checks that need the registries (reward, algorithm, episode names, the options of
    # task sources, models and rewards) run in preflight
    _source: ConfigSource = PrivateAttr(default_factory=ConfigSource)  # (not its value)

    @field_validator("plugins")
    @classmethod
    def _module_names(cls, names: list[str]) -> list[str]:
        return [check_module_name(name) for name in names]


# ---------------------------------------------------------------- loading

#: keys that were renamed: the old name is rejected with a message naming the new one
RENAMED_KEYS = {
    "train.batch_size": "train.items_per_step",
    "train.micro_batch_size": "train.micro_batch_sequences",
    "sft.batch_size": "sft.examples_per_step",
    "rollout.max_batch_size": "rollout.decode_slots",
    "stream.max_inflight_groups": "stream.max_inflight_items",
}


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
        if item["type"] == "extra_forbidden":
            msg = f"renamed to {RENAMED_KEYS[key]}" if key in RENAMED_KEYS else "unknown key"
        value = item.get("input")
        if item["type"] == "finite_entry":  # inside a dictionary or list: name the entry
            loc = (*loc, *item["ctx"]["path"].split("."))
            key, value = ".".join(loc), item["ctx"]["value"]
        whole = isinstance(value, dict) and len(loc) <= 1  # a section: do not dump it
        shown = "" if item["type"] == "missing" or whole else f" (got {value!r})"
        out.append(f"{source.where(loc)}: {key}: {msg}{shown}")
    if len(out) == 1:
        return f"invalid config: {out[0]}"
    return "invalid config:\n  " + "\n  ".join(out)


def config_to_dict(cfg: Config) -> dict[str, Any]:
    return cfg.model_dump(mode="json")


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def config_reference() -> str:
    """A Markdown table of every config key, its type, default and help text."""
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    top = Config.model_fields
    for name, field in top.items():
        section = field.annotation
        if isinstance(section, type) and issubclass(section, _Section):
            for sub, f in section.model_fields.items():
                rows.append(_reference_row(f"{name}.{sub}", f))
        else:
            rows.append(_reference_row(name, field))
    return "\n".join(rows)


def _reference_row(key: str, field: Any) -> str:
    annotation = getattr(field.annotation, "__name__", None) or str(field.annotation)
    annotation = annotation.replace("typing.", "").replace("|", "\\|")
    default = field.default_factory() if field.default_factory else field.default
    if isinstance(default, BaseModel):
        default = default.model_dump(mode="json")
    if isinstance(default, list):
        default = [d.model_dump(mode="json") if isinstance(d, BaseModel) else d for d in default]
    shown = str(default).replace("|", "\\|")
    return f"| `{key}` | {annotation} | `{shown}` | {field.description or ''} |"
