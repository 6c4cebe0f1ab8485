"""Run the worked ``>>>`` examples in every common/rl module's docstrings.

Run: pytest tests/test_rl_doctests.py
"""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["spans", "rewards", "weights", "loss", "schedule", "datums", "batch", "filters"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"common.rl.{name}")
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"common/rl/{name}.py has no worked example"
    assert result.failed == 0


def test_no_distributed_imports():
    import ast
    import pathlib

    root = pathlib.Path(importlib.import_module("common.rl").__file__).parent
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for n in names:
                assert not n.startswith(("torch.distributed", "ray", "sglang")), f"{path.name} imports {n}"
