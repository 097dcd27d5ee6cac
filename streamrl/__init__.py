"""streamrl: asynchronous, streaming RL post-training for language models and agents."""

__version__ = "0.1.0"
