"""The ``algorithm`` config section."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from streamrl.config.base import Section


class AlgorithmConfig(Section):
    advantage: str = Field(
        "grpo",
        description="grpo | dr_grpo | rloo | reinforce_pp | remax | gae | vtrace; on "
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
