"""The application layer: the ``sera`` command (``sera/cli.py``), which dispatches to the tiers."""
