"""The trainer's rank group: N processes joined by ``torch.distributed``.

Rank 0 is the controller's trainer (this process); ranks 1..N-1 are followers that run a
rank program (e.g. :func:`streamrl.engines.train.group.program.serve_rank`: build the
sharded engine, then execute the commands rank 0 broadcasts). Followers are spawned
processes on this machine (:class:`LocalGroup`) or Ray actors in a placement group
(:mod:`streamrl.engines.train.group.ray_group`). A follower that dies or hangs makes
rank 0's next collective fail (a closed connection, or ``collective_timeout_s``); the group
raises :class:`RankGroupFailed` and the run restarts the whole group from its last
checkpoint (:mod:`streamrl.run.launch`).
"""

from streamrl.engines.train.group.local import LocalGroup
from streamrl.engines.train.group.spec import GroupSpec, RankGroupFailed

__all__ = ["GroupSpec", "LocalGroup", "RankGroupFailed"]
