"""``Config``, the whole run: one typed section per component, each in its own module.

A config is a YAML file plus dotted ``key=value`` overrides::

    streamrl train examples/smoke.yaml train.steps=20 rollout.temperature=0.8

Every field is typed and documented where it is declared. Unknown keys and wrong
types are rejected with a message naming the key (and the YAML line when the
value came from a file): :mod:`streamrl.config.loading`. Defaults run on a laptop CPU.
"""

from __future__ import annotations

from pydantic import Field, PrivateAttr, field_validator

from streamrl.config.algorithm import AlgorithmConfig
from streamrl.config.base import Section
from streamrl.config.data import DataConfig
from streamrl.config.endpoint import EndpointConfig
from streamrl.config.env import EnvConfig
from streamrl.config.eval import EvalConfig
from streamrl.config.model import ModelConfig
from streamrl.config.monitors import MonitorsConfig
from streamrl.config.plugins import check_module_name
from streamrl.config.reading import ConfigSource
from streamrl.config.reward import RewardConfig
from streamrl.config.rollout import AgentConfig, RolloutConfig
from streamrl.config.run import RunConfig
from streamrl.config.runtime import RuntimeConfig
from streamrl.config.selection import SelectionConfig
from streamrl.config.stages import ALoLConfig, DPOConfig, SFTConfig
from streamrl.config.stream import StreamConfig
from streamrl.config.tinker import TinkerConfig
from streamrl.config.train import TrainConfig


class Config(Section):
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
    env: EnvConfig = Field(default_factory=EnvConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    stream: StreamConfig = Field(default_factory=StreamConfig)
    selection: SelectionConfig = Field(default_factory=SelectionConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    dpo: DPOConfig = Field(default_factory=DPOConfig)
    alol: ALoLConfig = Field(default_factory=ALoLConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    monitors: MonitorsConfig = Field(default_factory=MonitorsConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    endpoint: EndpointConfig = Field(default_factory=EndpointConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    tinker: TinkerConfig = Field(default_factory=TinkerConfig)
    # checks that need the registries (reward, algorithm, episode names, the options of
    # task sources, models and rewards) run in preflight
    _source: ConfigSource = PrivateAttr(default_factory=ConfigSource)  # (not its value)

    @field_validator("plugins")
    @classmethod
    def _module_names(cls, names: list[str]) -> list[str]:
        return [check_module_name(name) for name in names]
