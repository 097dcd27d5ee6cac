"""The types every layer shares: items, generation requests and results, trajectories,
batches, environment segments and transitions (``types.py``, ``transitions.py``), the
``Sample`` protocol they implement (``sample.py``), the trainers' ``LossFn`` protocol
(``loss.py``), the inference-engine protocol (``engine.py``), the messages between the
pool and its workers (``messages.py``), stage timing and atomic file writes. Imports
nothing else of streamrl."""
