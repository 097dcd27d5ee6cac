"""Policies for Gymnasium environments: small MLP and CNN actor-critics.

``build_policy(name, observation_space, action_space, **options)`` builds one:

- ``mlp``: separate actor and critic MLPs (tanh, orthogonal init, as in CleanRL and
  SB3's PPO defaults) for vector observations;
- ``cnn``: the Nature-DQN convolutional trunk (for (C, H, W) uint8 image observations,
  scaled to [0, 1]) shared by actor and critic heads.

Heads: a categorical distribution for ``Discrete`` actions, a diagonal Gaussian with a
state-independent log standard deviation for ``Box`` actions (actions are sampled
unbounded; the environment wrapper clips them to the box). ``agents=K`` (an environment of
K agents whose observations end in a one-hot agent id, ``data.kind: pettingzoo`` with
``policies: per_agent``) gives each agent its own actor and critic in one module: the
one-hot chooses the network, so one set of weights and one version still cover every
agent. ``obs_norm=True`` keeps a
running mean and variance of observations as buffers: they travel with the weights
(the trainer updates them from the segments it trains on; workers only read them).

A policy saves and loads like the language models: ``save_pretrained(dir)`` writes
``model.safetensors`` and ``config.json``; ``load_policy(dir)`` rebuilds it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import load_file, save_file
from torch import nn

from streamrl.config.options import validate_options

POLICY_PRESETS = ("mlp", "cnn")
MAX_WIDTH = 1 << 16  # units of one hidden layer
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _layer(i: int, o: int, gain: float = math.sqrt(2)) -> nn.Linear:
    layer = nn.Linear(i, o)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(sizes: list[int], out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, o in zip(sizes[:-2], sizes[1:-1], strict=True):
        layers += [_layer(i, o), nn.Tanh()]
    layers.append(_layer(sizes[-2], sizes[-1], out_gain))
    return nn.Sequential(*layers)


class PerAgent(nn.Module):
    """K networks over observations that end in a K-wide one-hot agent id: each row goes
    through its agent's network (the id itself is not an input).

    x (B, D + K) -> (B, out): sum_k onehot_k * net_k(x[:, :D])
    """

    def __init__(self, nets: list[nn.Module]) -> None:
        super().__init__()
        self.nets = nn.ModuleList(nets)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = len(self.nets)
        features, onehot = x[..., :-k], x[..., -k:]
        outs = torch.stack([net(features) for net in self.nets], dim=-2)  # (B, K, out)
        return (onehot.unsqueeze(-1) * outs).sum(-2)


def space_spec(space: Any) -> dict[str, Any]:
    """A JSON description of a gymnasium space (what a saved policy needs to rebuild)."""
    name = type(space).__name__
    if name == "Discrete":
        return {"type": "Discrete", "n": int(space.n)}
    if name == "Box":
        return {
            "type": "Box",
            "shape": list(space.shape),
            "low": np.asarray(space.low, dtype=np.float64).tolist(),
            "high": np.asarray(space.high, dtype=np.float64).tolist(),
            "dtype": str(space.dtype),
        }
    raise ValueError(
        f"unsupported space {space}: policies handle Box observations and Discrete or Box actions"
    )


class Policy(nn.Module):
    """Actor-critic over a Box observation space; see the module docstring."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = config
        obs, act = config["observation"], config["action"]
        if obs["type"] != "Box":
            raise ValueError(f"observation space must be a Box, got {obs['type']}")
        self.obs_shape = tuple(obs["shape"])
        self.discrete = act["type"] == "Discrete"
        self.act_dim = act["n"] if self.discrete else int(np.prod(act["shape"]))
        hidden = list(config.get("hidden", [64, 64]))
        self.agents = int(config.get("agents", 1))
        if self.agents > 1 and (config["arch"] != "mlp" or self.obs_shape[-1] <= self.agents):
            raise ValueError(
                f"agents={self.agents} needs an mlp over flat observations that end in a "
                f"{self.agents}-wide agent id, got {config['arch']} over {self.obs_shape}"
            )
        if config["arch"] == "cnn":
            if len(self.obs_shape) != 3:
                raise ValueError(f"cnn needs (C, H, W) observations, got {self.obs_shape}")
            c = self.obs_shape[0]
            self.trunk = nn.Sequential(
                nn.Conv2d(c, 32, 8, stride=4),
                nn.ReLU(),
                nn.Conv2d(32, 64, 4, stride=2),
                nn.ReLU(),
                nn.Conv2d(64, 64, 3, stride=1),
                nn.ReLU(),
                nn.Flatten(),
            )
            with torch.no_grad():
                width = self.trunk(torch.zeros(1, *self.obs_shape)).shape[1]
            self.trunk.append(_layer(width, 512))
            self.trunk.append(nn.ReLU())
            self.actor = _layer(512, self.act_dim, 0.01)
            self.critic = _layer(512, 1, 1.0)
        else:
            if len(self.obs_shape) != 1:
                raise ValueError(f"mlp needs flat observations, got shape {self.obs_shape}")
            self.trunk = nn.Identity()
            self.actor, self.critic = self._heads_mlp(hidden)
        if not self.discrete:
            self.log_std = nn.Parameter(
                torch.full((self.act_dim,), float(config.get("log_std", 0.0)))
            )
        self.obs_norm = bool(config.get("obs_norm", False))
        self.register_buffer("obs_mean", torch.zeros(self.obs_shape))
        self.register_buffer("obs_var", torch.ones(self.obs_shape))
        self.register_buffer("obs_count", torch.tensor(1e-4))

    def _heads_mlp(self, hidden: list[int]) -> tuple[nn.Module, nn.Module]:
        """(actor, critic) MLPs; one pair per agent, routed by the agent id, if agents > 1."""
        n = self.obs_shape[0]
        if self.agents == 1:
            return _mlp([n, *hidden, self.act_dim], 0.01), _mlp([n, *hidden, 1], 1.0)
        n -= self.agents
        return (
            PerAgent([_mlp([n, *hidden, self.act_dim], 0.01) for _ in range(self.agents)]),
            PerAgent([_mlp([n, *hidden, 1], 1.0) for _ in range(self.agents)]),
        )

    # ------------------------------------------------------------ observations

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        obs = obs.float()
        if self.config["arch"] == "cnn":
            return obs / 255.0
        if not self.obs_norm:
            return obs
        out = ((obs - self.obs_mean) / (self.obs_var + 1e-8).sqrt()).clamp(-10, 10)
        if self.agents > 1:  # the agent id stays a one-hot: it chooses the network
            out = torch.cat([out[..., : -self.agents], obs[..., -self.agents :]], dim=-1)
        return out

    @torch.no_grad()
    def update_obs_stats(self, obs: torch.Tensor) -> None:
        """Running mean/variance (parallel algorithm) from a batch (..., *obs_shape)."""
        if not self.obs_norm:
            return
        x = obs.reshape(-1, *self.obs_shape).double()
        n, mean, var = x.shape[0], x.mean(0), x.var(0, unbiased=False)
        total = self.obs_count.double() + n
        delta = mean - self.obs_mean.double()
        new_mean = self.obs_mean.double() + delta * n / total
        m2 = (
            self.obs_var.double() * self.obs_count + var * n + delta**2 * self.obs_count * n / total
        )
        self.obs_mean.copy_(new_mean.float())
        self.obs_var.copy_((m2 / total).float())
        self.obs_count.copy_(total.float())

    # ------------------------------------------------------------ heads

    # The distributions are written out rather than taken from torch.distributions: on
    # a 64-unit MLP their argument handling costs more than the network (these few ops
    # are the whole of Categorical's and Normal's log_prob, entropy and sampling).

    def _heads(
        self, features: torch.Tensor, actions: torch.Tensor | None, greedy: bool = False
    ) -> dict[str, torch.Tensor]:
        out = self.actor(features)
        if self.discrete:
            logp_all = out.log_softmax(-1)
            if actions is None:
                actions = (
                    out.argmax(-1) if greedy else torch.multinomial(logp_all.exp(), 1).squeeze(-1)
                )
            logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1)
            return {"actions": actions, "logprobs": logp, "entropy": entropy}
        log_std = self.log_std.expand_as(out)
        if actions is None:
            actions = out if greedy else out + log_std.exp() * torch.randn_like(out)
        z = (actions - out) * (-log_std).exp()
        logp = (-0.5 * z * z - log_std - _HALF_LOG_2PI).sum(-1)
        entropy = (0.5 + _HALF_LOG_2PI + log_std).sum(-1)
        return {"actions": actions, "logprobs": logp, "entropy": entropy}

    def forward(
        self, obs: torch.Tensor, actions: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """obs (B, *obs_shape), actions (B, ...) | None -> logprobs, entropy, values (B,)
        (and the sampled ``actions`` when none are given)."""
        features = self.trunk(self.normalize(obs))
        out = self._heads(features, actions)
        out["values"] = self.critic(features).squeeze(-1)
        if actions is not None:
            del out["actions"]
        return out

    @torch.no_grad()
    def act(self, obs: torch.Tensor, *, greedy: bool = False) -> dict[str, torch.Tensor]:
        """Actions (sampled, or the mode if ``greedy``), their log-probs and the values."""
        features = self.trunk(self.normalize(obs))
        out = self._heads(features, None, greedy=greedy)
        out["values"] = self.critic(features).squeeze(-1)
        return out

    # ------------------------------------------------------------ save / load

    def save_pretrained(self, path: str | Path, state_dict: dict[str, torch.Tensor] | None = None):
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        weights = state_dict if state_dict is not None else self.state_dict()
        save_file({k: v.contiguous() for k, v in weights.items()}, str(path / "model.safetensors"))
        (path / "config.json").write_text(json.dumps({"streamrl_policy": self.config}, indent=2))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


class PolicyOptions(BaseModel):
    """The options of a policy preset (``model.options``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    hidden: list[Annotated[int, Field(ge=1, le=MAX_WIDTH)]] = Field(
        default_factory=lambda: [64, 64], description="Hidden layer sizes (mlp)."
    )
    obs_norm: bool = Field(False, description="Running observation normalisation.")
    log_std: float = Field(0.0, description="Initial log standard deviation (Box actions).")


def build_policy(
    name: str, observation_space: Any, action_space: Any, *, agents: int = 1, **options: Any
) -> Policy:
    """A fresh policy ``name`` ('mlp' or 'cnn') for these spaces; options: those of
    :class:`PolicyOptions` (checked: an OptionsError names each bad one). ``agents``
    comes from the environment (its :meth:`~streamrl.sources.base.TaskSource.policy_options`),
    not from ``model.options``: one network per agent when > 1."""
    if name not in POLICY_PRESETS:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICY_PRESETS)}")
    config = {
        "arch": name,
        "observation": space_spec(observation_space),
        "action": space_spec(action_space),
        **validate_options(PolicyOptions, options, ("model", "options")),
    }
    if agents > 1:
        config["agents"] = int(agents)
    return Policy(config)


def is_policy_dir(path: str | Path) -> bool:
    config = Path(path) / "config.json"
    return config.is_file() and "streamrl_policy" in json.loads(config.read_text())


def names_a_policy(name_or_path: str) -> bool:
    """Whether ``model.name_or_path`` is an environment policy: a preset or a saved one."""
    path = Path(name_or_path).expanduser()
    return name_or_path in POLICY_PRESETS or (path.is_dir() and is_policy_dir(path))


def load_policy(path: str | Path) -> Policy:
    path = Path(path)
    if not is_policy_dir(path):
        raise FileNotFoundError(f"{path} is not a saved streamrl policy (no config.json)")
    policy = Policy(json.loads((path / "config.json").read_text())["streamrl_policy"])
    policy.load_state_dict(load_file(str(path / "model.safetensors")))
    return policy
