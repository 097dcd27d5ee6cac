"""Inference engines: the built-in batched KV-cache engine (``engine.py``), its sampler,
kernels and batching; the vLLM adapter; the engine of environment policies."""
