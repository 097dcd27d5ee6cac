"""The ``run`` config section: the run directory, logging sinks, checkpoints and early stops."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from streamrl.config.base import Section
from streamrl.config.options import check_path_component


class RunConfig(Section):
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
