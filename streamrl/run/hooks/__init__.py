"""Step hooks: the RL loop's concerns besides the algorithm, one module each
(:mod:`streamrl.run.hooks.base` describes the interface)."""

from streamrl.run.hooks.base import Decision, Hooks, StepHook

__all__ = ["Decision", "Hooks", "StepHook"]
