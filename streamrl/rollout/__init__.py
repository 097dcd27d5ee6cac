"""From an item to a scored group: the rollout worker (``worker.py``), episodes,
rewards, tools, the sandbox for model-written code, and prompt selection."""
