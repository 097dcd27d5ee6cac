"""The ``algorithm`` config section: which algorithm trains the policy, and its settings.

``algorithm.name`` selects the algorithm. The settings every policy-gradient update
shares (the policy loss and its clip range, aggregation, the entropy bonus, decoupled
PPO and its correction, the KL penalty, dynamic sampling) sit at the top of the section;
each family's own settings are nested under its name:

- ``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_pp``, ``reinforce_pp_baseline``, ``remax``:
  outcome-reward policy gradient (one advantage per sample, from the group's rewards);
- ``ppo`` (a learned critic with GAE) and ``appo`` (asynchronous PPO: the critic's
  targets and advantages by V-trace): ``algorithm.ppo.*``, and ``algorithm.vtrace.*``;
- ``bc``, ``iql``, ``td3_bc`` on transitions (logged data, environments):
  ``algorithm.offline.*``;
- ``turn_discounted``, ``gigpo``: per-turn credit of multi-turn episodes
  (``algorithm.turn.*``); ``rae``: role-conditioned baselines for self-play
  (``algorithm.rae.*``);
- ``distill``: on-policy distillation (a teacher's per-token reverse KL as the advantage
  or the loss): ``algorithm.distill.*``.

The names are the algorithms' own: ``ppo`` is PPO with a critic and GAE as CleanRL, SB3
and the RLHF recipe mean it, ``appo`` the V-trace variant by its name in Sample Factory
and RLlib. Keys and values of earlier versions are rejected with a message naming
their new spelling (:data:`RENAMED_KEYS`, :data:`RENAMED_NAMES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from streamrl.config.base import Section
from streamrl.config.distill import DistillConfig
from streamrl.config.hints import InterleavedSFTConfig

if TYPE_CHECKING:
    from streamrl.config.schema import Config

#: ``algorithm.name`` values of earlier versions -> their names now
RENAMED_NAMES = {"gae": "ppo", "vtrace": "appo"}

_OFFLINE_KEYS = (
    "expectile",
    "awr_beta",
    "awr_max_weight",
    "reward_scale",
    "target_tau",
    "td3_alpha",
    "policy_noise",
    "noise_clip",
    "policy_delay",
    "q_hidden",
)

#: the section's keys of earlier versions -> where they are now
RENAMED_KEYS = {
    "algorithm.advantage": "algorithm.name",
    "algorithm.kl_coef": "algorithm.kl.coef",
    "algorithm.kl_kind": "algorithm.kl.kind",
    "algorithm.is_correction": "algorithm.correction.kind",
    "algorithm.is_cap": "algorithm.correction.cap",
    "algorithm.icepop_band": "algorithm.correction.icepop_band",
    "algorithm.behave_imp_weight_cap": "algorithm.correction.behave_imp_weight_cap",
    "algorithm.gamma": "algorithm.ppo.gamma (ppo, appo) or algorithm.offline.gamma (iql, td3_bc)",
    "algorithm.gae_lambda": "algorithm.ppo.gae_lambda",
    "algorithm.vf_coef": "algorithm.ppo.vf_coef",
    "algorithm.vf_clip": "algorithm.ppo.vf_clip",
    "algorithm.norm_advantages": "algorithm.ppo.norm_advantages",
    "algorithm.clip_schedule": "algorithm.ppo.clip_schedule",
    "algorithm.rho_bar": "algorithm.vtrace.rho_bar",
    "algorithm.c_bar": "algorithm.vtrace.c_bar",
    **{f"algorithm.{key}": f"algorithm.offline.{key}" for key in _OFFLINE_KEYS},
}

#: values of renamed keys that changed too: new key -> {old value: new value}
RENAMED_VALUES = {"algorithm.name": RENAMED_NAMES}


class KLConfig(Section):
    """A KL penalty to a frozen copy of the policy RL starts from (policy gradient on
    language models)."""

    coef: float = Field(0.0, ge=0, description="Weight of the KL penalty (0 = off).")
    kind: Literal["k1", "k2", "k3"] = Field("k3", description="KL estimator.")


class CorrectionConfig(Section):
    """What is done to the decoupled weight pi_prox/pi_behave (``algorithm.decoupled``),
    whose extremes come from the train/inference mismatch."""

    kind: Literal["none", "tis", "mis", "icepop"] = Field(
        "none",
        description="tis (truncate at correction.cap), mis (mask above correction.cap), "
        "icepop (mask outside correction.icepop_band).",
    )
    cap: float = Field(2.0, gt=0, description="tis / mis: the importance weight's cap.")
    icepop_band: list[float] = Field(
        default_factory=lambda: [0.5, 2.0],
        min_length=2,
        max_length=2,
        description="icepop: [low, high] band of kept importance weights.",
    )
    behave_imp_weight_cap: float | None = Field(
        None, description="Mask tokens whose pi_prox/pi_behave exceeds this (AReaL's cap)."
    )


class PPOConfig(Section):
    """``ppo`` and ``appo``: the learned critic and how it is trained."""

    gamma: float = Field(0.99, ge=0, le=1, description="Discount.")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda (ppo).")
    vf_coef: float = Field(0.5, ge=0, description="Value-loss weight.")
    vf_clip: float | None = Field(
        None,
        gt=0,
        description="Clip the new value within this of the old one (PPO's value "
        "clipping); None: an unclipped squared error.",
    )
    norm_advantages: bool = Field(True, description="Normalise advantages per minibatch.")
    clip_schedule: Literal["constant", "linear"] = Field(
        "constant", description="Anneal the clip range (algorithm.clip_low) linearly to 0."
    )


class VTraceConfig(Section):
    """``appo``: V-trace's truncation of the importance weights."""

    rho_bar: float = Field(1.0, gt=0, description="Importance-weight cap of the value targets.")
    c_bar: float = Field(1.0, gt=0, description="Trace-cutting cap.")


class OfflineConfig(Section):
    """``bc``, ``iql``, ``td3_bc``: TD algorithms on transitions."""

    gamma: float = Field(0.99, ge=0, le=1, description="Discount (iql, td3_bc).")
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


class TurnConfig(Section):
    """``turn_discounted`` and ``gigpo``: per-turn rewards of multi-turn episodes."""

    gamma: float = Field(
        1.0, ge=0, le=1, description="Discount from one turn to the next (per turn, not token)."
    )
    step_weight: float = Field(
        1.0, ge=0, description="gigpo: weight of the step-level (anchor state) advantage."
    )


class RAEConfig(Section):
    """``rae``: a baseline per game and role (SPIRAL's role-conditioned advantages)."""

    decay: float = Field(
        0.95,
        ge=0,
        lt=1,
        description="Decay of each (game, role) baseline, an exponential moving average of "
        "that role's returns.",
    )


class AlgorithmConfig(Section):
    """The algorithm and its settings (the module docstring lists the families)."""

    name: str = Field(
        "grpo",
        description="grpo | dr_grpo | rloo | reinforce_pp | reinforce_pp_baseline | remax "
        "(outcome-reward policy gradient); ppo (learned critic, GAE) | appo (learned critic, "
        "V-trace); on transitions (offline data, environments): bc | iql | td3_bc; multi-turn "
        "credit: turn_discounted | gigpo; self-play: rae; distill (on-policy distillation from "
        "a teacher); or one a plugin registers.",
    )
    # ---- the policy-gradient update (every algorithm but bc, iql and td3_bc)
    policy_loss: str = Field(
        "ppo_clip", description="ppo_clip | gspo | cispo (outcome-reward algorithms)."
    )
    clip_low: float = Field(0.2, ge=0, description="PPO lower clip epsilon.")
    clip_high: float = Field(0.28, ge=0, description="PPO upper clip epsilon (DAPO clip-higher).")
    agg_mode: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = Field(
        "token_mean", description="How per-token losses are averaged."
    )
    entropy_coef: float = Field(0.0, description="Entropy bonus coefficient.")
    decoupled: bool = Field(
        True,
        description="Decoupled PPO (AReaL): clip against the proximal policy (current "
        "weights before the update), weight by pi_prox/pi_behave; ppo: stale env steps.",
    )
    correction: CorrectionConfig = Field(default_factory=CorrectionConfig)
    kl: KLConfig = Field(default_factory=KLConfig)
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
    # ---- each family's own settings
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    vtrace: VTraceConfig = Field(default_factory=VTraceConfig)
    offline: OfflineConfig = Field(default_factory=OfflineConfig)
    turn: TurnConfig = Field(default_factory=TurnConfig)
    rae: RAEConfig = Field(default_factory=RAEConfig)
    distill: DistillConfig = Field(default_factory=DistillConfig)
    interleaved_sft: InterleavedSFTConfig = Field(default_factory=InterleavedSFTConfig)

    @field_validator("name")
    @classmethod
    def _renamed(cls, name: str) -> str:
        if name in RENAMED_NAMES:
            raise ValueError(f"{name!r} is now called {RENAMED_NAMES[name]!r}")
        return name


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """What an algorithm knows of the run beyond its own section: a few values of other
    sections, each named. The caller, which holds the whole config, fills it
    (:meth:`of`); the algorithm never sees the whole ``Config``."""

    group_size: int
    """rollout.group_size: samples per item."""
    max_new_tokens: int
    """rollout.max_new_tokens: the generation budget (Dr. GRPO's constant divisor)."""
    updates_per_batch: int
    """train.num_minibatches * train.epochs: optimizer steps per batch."""
    total_updates: int
    """train.steps * updates_per_batch: the run's optimizer steps (clip annealing)."""
    max_staleness: int
    """stream.max_staleness: eta (0: every sample is on-policy)."""
    episode: str
    """rollout.episode: what a sample is (``gym``: environment segments, logged data)."""
    seed: int
    """The run's seed (the initialisation of extra networks, their noise)."""

    @classmethod
    def of(cls, cfg: Config) -> RunContext:
        t = cfg.train
        updates = t.num_minibatches * t.epochs
        return cls(
            group_size=cfg.rollout.group_size,
            max_new_tokens=cfg.rollout.max_new_tokens,
            updates_per_batch=updates,
            total_updates=t.steps * updates,
            max_staleness=cfg.stream.max_staleness,
            episode=cfg.rollout.episode,
            seed=cfg.seed,
        )
