"""Evaluation and the statistics of runs: held-out evaluation (``evaluate.py``), pass@k,
interval estimates and tests, comparisons, scaling fits and plots."""
