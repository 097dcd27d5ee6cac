"""The sandbox for model-written code: ``Sandbox().run(code) -> SandboxResult``.

``runner`` runs a program (strong: bubblewrap namespaces + seccomp + a cgroup + rlimits;
weak, only when asked for: rlimits + a cgroup); ``mounts`` is what the strong sandbox's
filesystem and environment hold; ``seccomp`` the kernel calls it denies; ``cgroups`` the
per-run cgroup; ``process`` the asyncio plumbing. See docs/reliability.md.
"""

from streamrl.rollout.sandbox.cgroups import find_support, support
from streamrl.rollout.sandbox.mounts import keep_paths
from streamrl.rollout.sandbox.runner import (
    CGROUP_MODES,
    ISOLATIONS,
    MECHANISMS,
    SANDBOX_UID,
    Sandbox,
    SandboxError,
    SandboxResult,
    acheck,
    bwrap_binary,
    check,
    describe,
    tool,
)

__all__ = [
    "CGROUP_MODES",
    "ISOLATIONS",
    "MECHANISMS",
    "SANDBOX_UID",
    "Sandbox",
    "SandboxError",
    "SandboxResult",
    "acheck",
    "bwrap_binary",
    "check",
    "describe",
    "find_support",
    "keep_paths",
    "support",
    "tool",
]
