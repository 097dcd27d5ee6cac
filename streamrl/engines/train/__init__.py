"""Train engines: ``train_batch(batch, loss_fn)`` for language models (``engine.py``, with
row packing) and for environment policies (``policy.py``); the optimizer and schedules."""
