"""The ``model`` config section: which model is trained, its dtype and LoRA adapters."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from streamrl.config.base import Section


class ModelConfig(Section):
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
