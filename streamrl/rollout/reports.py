"""How an item that could not become a group is reported."""

from __future__ import annotations

import traceback

from streamrl.core.messages import GroupRejected
from streamrl.rollout.rewards import describe_error


def failed_report(index: int, kind: str, error: BaseException) -> GroupRejected:
    """Item ``index`` failed (``kind``: ``episode_error``, ``selection_error``, ...): its
    detail is a one-line summary first (what the console and errors quote), then the
    traceback."""
    detail = describe_error(error) + "\n" + "".join(traceback.format_exception(error)).strip()
    return GroupRejected(index, "failed", f"{kind}:{type(error).__name__}", detail)
