"""Run the worked ``>>>`` examples of the shared modules outside ``common/rl`` (those are in
tests/test_rl_doctests.py), so that an example a reader copies still works.

Run: pytest tests/test_doctests.py
"""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "common.config",
    "common.templates",
    "common.run.metrics",
    "common.run.progress",
    "common.envs.textcraft.prompts",
    "common.policy.warmstart",
    "common.run.setup",
    "common.train_eval",
    "common.train_config",
    "level1_batched.vllm_engine",
    "common.run.trainer_memory",
    "level1_batched.efficiency",
    "level1_batched.overlap",
    "level1_batched.config",
    "level2_distributed.train",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has no worked example"
    assert result.failed == 0
