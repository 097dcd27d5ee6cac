"""PolicyEngine: the inference engine of environment policies (the analogue of LocalEngine).

It holds its own copy of a :class:`~streamrl.models.policies.Policy`, acts on batches
of observations, and takes new weights from any thread (``update_weights`` or
``stage_weights``, see :mod:`streamrl.engines.inference.staging`); they are applied at the next
``act`` (between two environment steps), so every step is played by exactly one weight
version, which the segment records.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from streamrl.engines.inference.staging import WeightStaging
from streamrl.models.policies import Policy


@dataclass
class PolicyEngineStats:
    steps: int = 0  # act() calls
    env_steps: int = 0  # observations acted on
    weight_updates: int = 0


class PolicyEngine(WeightStaging):
    def __init__(self, policy: Policy, *, device: str = "cpu", version: int = 0) -> None:
        self.policy = policy.to(device).eval()
        self.device = torch.device(device)
        self.version = version
        self.stats = PolicyEngineStats()
        self._acting = threading.Lock()  # held while a step runs
        self._init_staging(self._acting)

    def _load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        with torch.no_grad():
            self.policy.load_state_dict(state_dict)
        self.version = version
        self.stats.weight_updates += 1

    @torch.no_grad()
    def act(self, obs: np.ndarray, *, greedy: bool = False) -> dict[str, np.ndarray]:
        """obs (N, *obs_shape) -> actions, logprobs (N,), values (N,) as numpy arrays."""
        with self._acting:
            self._apply_staged()
            out = self.policy.act(torch.as_tensor(obs, device=self.device), greedy=greedy)
        self.stats.steps += 1
        self.stats.env_steps += int(obs.shape[0])
        return {
            k: v.cpu().numpy() for k, v in out.items() if k in ("actions", "logprobs", "values")
        }

    @torch.no_grad()
    def values(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) (N,): bootstraps for truncated episodes and the segment's tail."""
        with self._acting:
            x = self.policy.normalize(torch.as_tensor(obs, device=self.device))
            return self.policy.critic(self.policy.trunk(x)).squeeze(-1).cpu().numpy()

    # the LocalEngine interface the rollout worker and backends use
    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def close(self) -> None:
        pass

    async def agenerate(self, request: Any) -> Any:
        raise TypeError("a PolicyEngine acts on observations; it does not generate text")
