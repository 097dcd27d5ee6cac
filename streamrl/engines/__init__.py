"""Inference and train engines, the batch-invariant kernels both share, and the factory
that builds them from a config."""
