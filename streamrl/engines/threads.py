"""A thread's own torch thread count, set so that it stays set.

torch gives each thread its OpenMP thread count lazily, at the thread's first parallel op
(or first ``torch.get_num_threads()``), from the process-wide count of that moment, and a
count set on the thread before then is overwritten. So a rollout thread that set one
thread, then loaded weights while the trainer's thread had set two, loaded them with two.

That matters beyond the load. The thread keeps a second OpenMP team alive, and libgomp
spins at its barriers only while it manages no more threads than the process has cores;
past that, every team's threads sleep in the kernel at each barrier and are woken for the
next op. On the 2-core CPU a decode step driven with two threads then took ~150-250 ms
instead of ~90 ms (``benchmarks/results/rl_step.md``).
"""

from __future__ import annotations

import torch


def set_thread_torch_threads(threads: int) -> None:
    """Gives the calling thread ``threads`` torch threads, for good (see the module
    docstring). Like ``torch.set_num_threads``, it also sets the process-wide count that
    threads started later take."""
    torch.get_num_threads()  # torch's lazy per-thread set-up runs now, not after the set
    torch.set_num_threads(max(1, threads))
