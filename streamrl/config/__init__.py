"""The config schema, one module per section, and how a config is read: YAML files and
``key=value`` overrides (``reading.py``, ``schema.py``), the options of components
(``options.py``) and user plugins (``plugins.py``)."""
