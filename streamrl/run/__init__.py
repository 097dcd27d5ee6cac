"""One training run: the session and its loop (``session.py``), preflight checks, launch
(local or Ray), checkpoints and resume, the run directory (lock, files, tracking, sinks),
per-step metrics, signals, progress, sweeps."""
