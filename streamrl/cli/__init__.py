"""The ``streamrl`` command line (``main.py``); ``eval.py`` is ``streamrl eval``."""
