"""``python -m sera`` = the ``sera`` command."""

from sera.cli import app

app()
