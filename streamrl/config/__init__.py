"""The config: one module per section (``model.py``, ``data.py``, ``reward.py``,
``rollout.py``, ``algorithm.py``, ``train.py``, ``stream.py``, ``selection.py``,
``stages.py``, ``env.py``, ``eval.py``, ``runtime.py``, ``endpoint.py``, ``run.py``; their base in
``base.py``), the whole run's ``Config`` (``schema.py``), how a config is read and its
errors are worded (``reading.py``, ``loading.py``), the reference of every key
(``reference.py``, the source of ``docs/config.md``), the options of components
(``options.py``) and user plugins (``plugins.py``)."""

from streamrl.config.algorithm import (
    AlgorithmConfig,
    CorrectionConfig,
    KLConfig,
    OfflineConfig,
    PPOConfig,
    RAEConfig,
    RunContext,
    TurnConfig,
    VTraceConfig,
)
from streamrl.config.base import LRSchedule, Section
from streamrl.config.data import DataConfig
from streamrl.config.endpoint import EndpointConfig
from streamrl.config.env import EnvConfig
from streamrl.config.eval import EvalConfig
from streamrl.config.loading import (
    RENAMED_KEYS,
    ConfigError,
    config_to_dict,
    load_config,
    parse_override,
    save_config,
    source_of,
)
from streamrl.config.model import ModelConfig
from streamrl.config.reference import config_reference
from streamrl.config.reward import RewardComponent, RewardConfig
from streamrl.config.rollout import AgentConfig, RolloutConfig, VLLMOptions
from streamrl.config.run import RunConfig
from streamrl.config.runtime import RuntimeConfig
from streamrl.config.schema import Config
from streamrl.config.selection import SelectionConfig
from streamrl.config.stages import ALoLConfig, DPOConfig, SFTConfig
from streamrl.config.stream import StreamConfig
from streamrl.config.train import TrainConfig

__all__ = [
    "VTraceConfig",
    "TurnConfig",
    "RAEConfig",
    "EnvConfig",
    "PPOConfig",
    "OfflineConfig",
    "KLConfig",
    "CorrectionConfig",
    "RENAMED_KEYS",
    "ALoLConfig",
    "AgentConfig",
    "AlgorithmConfig",
    "Config",
    "ConfigError",
    "DPOConfig",
    "DataConfig",
    "EndpointConfig",
    "EvalConfig",
    "LRSchedule",
    "ModelConfig",
    "RewardComponent",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "RunContext",
    "RuntimeConfig",
    "SFTConfig",
    "Section",
    "SelectionConfig",
    "StreamConfig",
    "TrainConfig",
    "VLLMOptions",
    "config_reference",
    "config_to_dict",
    "load_config",
    "parse_override",
    "save_config",
    "source_of",
]
