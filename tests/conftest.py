"""Test-session settings: no network at run time.

The project promises that nothing is downloaded or reported at run time (the bundled model is a local
file, tests use local or random-init models). A CI machine without network access can make a library's
background call wait for its own timeout instead of failing fast, so every library that might try is
told not to, for this process and every subprocess a test starts (they inherit the environment):
the Hugging Face hub (transformers, tokenizers), Ray's and vLLM's usage statistics. Gloo process groups
(level 1's data parallel, level 2's FSDP ranks: every rank on this machine) use the loopback interface
instead of resolving the machine's host name, which a machine without DNS can make wait.
"""

from __future__ import annotations

import os

import pytest

OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "GLOO_SOCKET_IFNAME": "lo",
}
for _name, _value in OFFLINE.items():
    os.environ.setdefault(_name, _value)


@pytest.fixture(scope="session")
def level0_on_the_fixture() -> dict:
    """Level 0 (``accumulate_gradients``: one forward/backward per datum) on every stage of
    tests/fixtures/rl_fixture.json, each on a fresh seed-0 ``tiny`` model: ``{stage: {"metrics", "grads"}}``.
    Computed once per session: tests/test_level0.py checks it against the golden numbers and
    tests/test_level1.py uses it as the oracle of its packed and data-parallel runs."""
    import json
    from pathlib import Path

    from common.policy.models import load_model
    from common.rl.datums import Datum
    from level0_single_process.train import accumulate_gradients

    fx = json.loads((Path(__file__).parent / "fixtures" / "rl_fixture.json").read_text())
    out = {}
    for stage, st in fx["stages"].items():
        model, _ = load_model("tiny", dtype="float32", seed=0)
        model.train()
        metrics = accumulate_gradients(model, [Datum(**d) for d in st["datums"]], st["weights"])
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        out[stage] = {"metrics": metrics, "grads": grads}
    return out
