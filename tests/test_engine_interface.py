"""The engine interface (``common/policy/engine.py``) and tier-registered policy kinds (``make_policy``).

A fake engine (no model) checks what every engine inherits: the batching queue groups concurrent
``generate`` calls into one ``_run_batch``, an exception fails only its own request, ``update_weights``
sets the policy version and reports seconds, and sleep/wake default to no-ops. Run:
``pytest tests/test_engine_interface.py``.
"""

from __future__ import annotations

import asyncio

import pytest

from common.policy import make_policy, register_engine
from common.policy.base import Completion, GenerationRequest, SamplingParams
from common.policy.engine import Engine, completion_text, find_stop, named_weights


class FakeEngine(Engine):
    name = "fake"

    def __init__(self, arg: str = "", **kw) -> None:
        super().__init__(max_batch_size=4, max_wait_ms=50)
        self.arg, self.batches, self.loaded = arg, [], []

    def _run_batch(self, requests):
        self.batches.append(len(requests))
        out = []
        for r in requests:
            text = r.messages[-1]["content"]
            out.append(ValueError("bad") if text == "bad" else Completion(text=text.upper(), output_ids=[1]))
        return out

    def _load_weights(self, pairs):
        self.loaded.extend(name for name, _ in pairs)


def _req(text: str) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": text}], sampling=SamplingParams(4))


def test_queue_batches_concurrent_calls_and_isolates_errors():
    eng = FakeEngine()

    async def run():
        return await asyncio.gather(
            *(eng.generate(_req(t)) for t in ["a", "bad", "c", "d", "e"]), return_exceptions=True
        )

    res = asyncio.run(run())
    assert eng.batches == [4, 1]  # max_batch_size 4, then the rest
    assert [r.text for r in res if isinstance(r, Completion)] == ["A", "C", "D", "E"]
    assert isinstance(res[1], ValueError)
    with pytest.raises(ValueError, match="bad"):
        eng.generate_batch([_req("x"), _req("bad")])


def test_update_weights_sets_version():
    eng = FakeEngine()
    assert eng.version == 0
    secs = eng.update_weights({"w": 1, "b": 2})
    assert eng.version == 1 and secs >= 0 and eng.loaded == ["w", "b"]
    eng.update_weights([("x", 3)], version=7)
    assert eng.version == 7 and eng.loaded[-1] == "x"
    eng.update_weights(None)  # shared model: nothing copied
    assert eng.version == 8 and len(eng.loaded) == 3
    eng.sleep()
    assert eng.asleep and not eng.supports_sleep
    eng.wake()
    assert not eng.asleep


def test_named_weights_rejects_garbage():
    assert named_weights({"a": 1}) == [("a", 1)]
    with pytest.raises(TypeError, match="mapping or"):
        named_weights([1, 2])


def test_completion_text_cuts_after_stop():
    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return "abc<x>def"

    assert completion_text(Tok(), [1], ("<x>",)) == ("abc<x>", True)
    assert completion_text(Tok(), [1], ()) == ("abc<x>def", False)
    assert find_stop("a</b>c<b>", ("<b>", "</b>")) == 5


def test_tier_engine_kinds(monkeypatch):
    import common.policy as cp

    monkeypatch.setattr(cp, "ENGINE_FACTORIES", {})
    with pytest.raises(ValueError, match="level1_batched"):
        make_policy("vllm:smollm2")  # common/ never imports the tier: the error says where it lives
    register_engine("fake", FakeEngine)
    eng = make_policy("fake:thing", env="textcraft")
    assert isinstance(eng, FakeEngine) and eng.arg == "thing"
    with pytest.raises(ValueError, match="needs a model"):
        make_policy("fake:")


def test_level1_package_registers_the_vllm_kind(monkeypatch):
    import importlib
    import importlib.util

    import common.policy as cp

    monkeypatch.setattr(cp, "ENGINE_FACTORIES", {})
    importlib.reload(importlib.import_module("level1_batched"))
    assert "vllm" in cp.ENGINE_FACTORIES
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(RuntimeError, match="needs vLLM"):
            make_policy("vllm:smollm2")
