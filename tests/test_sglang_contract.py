"""The SGLang server adapter (``level2_distributed.servers.SGLangServer``) against a FAKE SGLang server.

SGLang cannot be installed here (every release pins torch 2.9.1), so ``tests/fake_sglang`` provides a
``python -m sglang.launch_server`` written from SGLang's source (its docstring lists what it follows). The
adapter is the real one, started by ``--server-python`` (this interpreter, with the fake on PYTHONPATH).
The trainer side of the weight broadcast is the real ``sync.init_named_group`` (SGLang's group naming);
the "trainer" here is a second ``tiny-tied`` model (seed 1). Checked:

* the adapter's flags are the ones SGLang accepts (the fake's argparse refuses others);
* context = min(model window 8192, the server's KV pool 4096 from /get_server_info);
* broadcast over the named group: the server then scores with the trainer's weights (raw log-probs
  within ``LOGP_TOL`` of ``HFPolicy``'s on the same weights), the tied head included;
* sampled generations (T = 0.7) report RAW log-probs (``SGLANG_RETURN_ORIGINAL_LOGPROB`` set by the
  adapter; the fake returns tempered ones otherwise) and a seeded request repeats exactly
  (``--enable-deterministic-inference``);
* ``shutdown`` ends the server process.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_sglang"
LOGP_TOL = 1e-4


def test_sglang_adapter_against_a_fake_server_from_sglangs_source(tmp_path, monkeypatch):
    from common.policy.base import GenerationRequest, SamplingParams
    from common.policy.hf import HFPolicy
    from common.policy.models import load_model
    from level1_batched.vllm_engine import save_model
    from level2_distributed.servers import SGLANG_GROUP, SGLangServer
    from level2_distributed.sync import NamedGroup, broadcast_tensor, free_port, init_named_group
    from level2_distributed.trainer import unique_state

    start, tok = load_model("tiny-tied", dtype="float32", seed=0)
    path = save_model(start, tok, tmp_path / "model")
    trainer, _ = load_model("tiny-tied", dtype="float32", seed=1)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(FAKE), str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    server = SGLangServer(path, "float32", 0, 4, server_python=sys.executable, deterministic=True)
    try:
        assert server.info()["max_context_tokens"] == 4096

        port = free_port()
        specs = [(n, list(t.shape), "float32") for n, t in unique_state(trainer)]

        def trainer_side():
            group = NamedGroup(init_named_group("gloo", "127.0.0.1", port, 0, 2, SGLANG_GROUP))
            for _, t in unique_state(trainer):
                broadcast_tensor(group, t.detach().contiguous())

        sender = threading.Thread(target=trainer_side)
        sender.start()

        async def receive():
            await server.join_sync_group("127.0.0.1", port, 1, 2)
            return await server.receive_broadcast(specs, 1, "float32")

        asyncio.run(receive())
        sender.join(timeout=60)
        assert server.info()["version"] == 1

        ref = HFPolicy(trainer, tok)
        prompt = tok("The quick brown fox jumps over")["input_ids"]
        output = tok(" the lazy dog and runs away")["input_ids"]
        server._session = None  # the client session belongs to the event loop that made it
        got = asyncio.run(server.score_logprobs(prompt, output))
        want = ref.score_logprobs(prompt, output)
        diff = max(abs(a - b) for a, b in zip(got, want, strict=True))
        print(f"fake SGLang after the named-group broadcast: max |server - trainer| log-prob {diff:.1e}")
        assert diff <= LOGP_TOL

        req = GenerationRequest(messages=[{"role": "user", "content": "Say hi"}],
                                sampling=SamplingParams(12, temperature=0.7, seed=5, ignore_eos=True))  # fmt: skip

        async def two():
            server._session = None  # a fresh client session in this event loop
            a = await server.generate(req)
            b = await server.generate(req)
            return a, b

        (c1, v1), (c2, _) = asyncio.run(two())
        assert v1 == 1 and c1.output_ids == c2.output_ids and len(c1.output_ids) == 12  # seeded: repeats
        raw = ref.score_logprobs(c1.prompt_ids, c1.output_ids)
        tempered = ref.score_logprobs(c1.prompt_ids, c1.output_ids, temperature=0.7)
        gap_raw = max(abs(a - b) for a, b in zip(c1.logprobs, raw, strict=True))
        gap_tempered = max(abs(a - b) for a, b in zip(c1.logprobs, tempered, strict=True))
        print(f"behaviour log-probs vs raw {gap_raw:.1e}, vs tempered {gap_tempered:.1e}")
        assert gap_raw <= LOGP_TOL < gap_tempered
    finally:
        server.shutdown()
    assert server.proc.poll() is not None
