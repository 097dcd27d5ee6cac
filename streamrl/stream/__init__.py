"""The sample stream (``sample_stream.py``: admission under the staleness bound, groups,
accounting), the pool that feeds it from rollout workers (``pool.py``, ``books.py``), where
the workers run (``backends/``), and the endpoint for external agents (``endpoint/``)."""
