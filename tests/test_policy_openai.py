"""OpenAIPolicy against real servers on 127.0.0.1: ``serve.py`` (always) and vLLM (when installed).

The vLLM test needs a CPU build of vLLM in its own virtualenv (``SERA_VLLM_PYTHON``, default
``/opt/sera-vllm/bin/python``; see ``common/policy/openai.py``); it is skipped with the reason otherwise.
Run: ``pytest tests/test_policy_openai.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from common.policy.base import GenerationRequest, SamplingParams
from common.policy.hf import HFPolicy
from common.policy.openai import OpenAIPolicy, normalise_base_url, parse_chat_response
from common.policy.serve import start_server

MSGS = [{"role": "user", "content": "Name three colors."}]


def _req(content: str, n: int = 10, **kw) -> GenerationRequest:
    return GenerationRequest(
        messages=[{"role": "user", "content": content}], sampling=SamplingParams(max_new_tokens=n, **kw)
    )


@pytest.fixture(scope="module")
def tiny_server():
    policy = HFPolicy("tiny", dtype="float32", device="cpu", max_batch_size=8, max_wait_ms=20)
    server = start_server(policy, "127.0.0.1", 0, model_name="tiny")
    try:
        yield policy, server
    finally:
        server.close()


def test_openai_policy_cannot_push_weights():
    policy = OpenAIPolicy("http://127.0.0.1:1", "m")
    assert policy.version == 0
    with pytest.raises(NotImplementedError, match="server-side"):
        policy.update_weights({})


def test_normalise_base_url():
    assert normalise_base_url("http://h:1") == "http://h:1/v1"
    assert normalise_base_url("http://h:1/v1/") == "http://h:1/v1"
    assert normalise_base_url("127.0.0.1:8000") == "http://127.0.0.1:8000/v1"


def test_parse_response_without_token_ids_is_not_exact():
    data = {"choices": [{"message": {"content": "hi"}, "finish_reason": "length"}]}
    comp, exact = parse_chat_response(data)
    assert not exact and comp.text == "hi" and comp.output_ids == [] and comp.finish_reason == "length"
    data = {
        "prompt_token_ids": [1, 2],
        "choices": [
            {
                "message": {"content": "ab"},
                "finish_reason": "stop",
                "stop_reason": "b",
                "logprobs": {
                    "content": [{"token": "token_id:5", "logprob": -0.5}, {"id": 6, "logprob": -1.0}]
                },
            }
        ],
    }
    comp, exact = parse_chat_response(data, ("b",))
    assert exact and comp.output_ids == [5, 6] and comp.logprobs == [-0.5, -1.0] and comp.prompt_ids == [1, 2]


def test_openai_policy_matches_local_policy(tiny_server):
    policy, server = tiny_server
    reqs = [_req(p, temperature=0.0) for p in ("hi", "What is 2+2?", "Tell me a story " * 5)]
    reqs.append(_req("sample me", temperature=1.0, seed=7))

    async def run():
        client = OpenAIPolicy(server.url)
        try:
            return await client.generate_many(reqs), client
        finally:
            await client.aclose()

    # The batch starts when all 4 requests wait (a full batch), however late the last one arrives on a
    # loaded machine; a 20 ms window (the fixture's) let a slow HTTP request miss it and form a 2nd batch.
    queue = policy.queue
    saved = queue.max_batch_size, queue.max_wait_ms
    queue.max_batch_size, queue.max_wait_ms = len(reqs), 60_000.0
    before = policy.stats["batches"]
    try:
        remote, client = asyncio.run(run())
    finally:
        queue.max_batch_size, queue.max_wait_ms = saved
    assert client.trainable and client.model == "tiny"
    assert policy.stats["batches"] - before == 1  # concurrent HTTP requests were batched together
    local = policy.generate_batch(reqs)
    for r, loc in zip(remote, local, strict=True):
        assert r.prompt_ids == loc.prompt_ids and r.output_ids == loc.output_ids
        assert r.text == loc.text and r.finish_reason == loc.finish_reason
        assert max(abs(a - b) for a, b in zip(r.logprobs, loc.logprobs, strict=True)) < 1e-4


def test_openai_policy_stop_string(tiny_server):
    policy, server = tiny_server
    free = policy.generate_batch([_req("What is 2+2?", n=20, temperature=0.0)])[0]
    piece = next(p for p in (policy.tokenizer.decode([t]).strip() for t in free.output_ids[6:]) if p)
    stop = piece[:2]

    async def run():
        client = OpenAIPolicy(server.url, "tiny")
        try:
            return await client.generate(_req("What is 2+2?", n=20, temperature=0.0, stop=(stop,)))
        finally:
            await client.aclose()

    comp = asyncio.run(run())
    assert comp.finish_reason == "stop" and comp.text.endswith(stop) and len(comp.output_ids) < 20
    assert comp.output_ids == free.output_ids[: len(comp.output_ids)]


def test_server_rejects_bad_requests(tiny_server):
    _, server = tiny_server
    for body in ({"messages": []}, {"messages": MSGS, "stream": True}, [1, 2]):
        req = urllib.request.Request(
            server.url + "/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=30)
        assert info.value.code == 400
    with urllib.request.urlopen(server.url + "/v1/models", timeout=30) as resp:
        assert json.load(resp)["data"][0]["id"] == "tiny"


# ---------------------------------------------------------------------------------------------- vLLM
VLLM_PYTHON = Path(os.environ.get("SERA_VLLM_PYTHON", "/opt/sera-vllm/bin/python"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    if not VLLM_PYTHON.is_file():
        pytest.skip(f"vLLM is not installed ({VLLM_PYTHON} missing; set SERA_VLLM_PYTHON)")
    probe = subprocess.run(
        [
            str(VLLM_PYTHON),
            "-c",
            "import importlib.util,sys; sys.exit(importlib.util.find_spec('vllm') is None)",
        ],
        capture_output=True,
        timeout=60,
    )
    if probe.returncode != 0:
        pytest.skip(f"{VLLM_PYTHON} has no vllm package")
    from common.policy.models import ensure_smollm2

    model_dir = ensure_smollm2()
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    # no --logprobs-mode: vLLM's default raw_logprobs is the trainer's T = 1 distribution (engine.py)
    cmd = [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", "smollm2",
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "2048",
        "--kv-cache-memory-bytes", str(512 * 2**20), "--enforce-eager",
    ]  # fmt: skip
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                pytest.skip(f"vLLM exited with {proc.returncode}: {log.read_text()[-1500:]}")
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=5):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    pytest.skip(f"vLLM not ready after 180 s: {log.read_text()[-1500:]}")
                time.sleep(1.0)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=30)


@pytest.mark.slow
def test_openai_policy_against_vllm_matches_hf(vllm_server):
    reqs = [GenerationRequest(messages=MSGS, sampling=SamplingParams(16, temperature=0.0))]
    reqs += [_req(f"Count to {i}.", n=12, temperature=1.0, seed=i) for i in range(4)]
    reqs.append(
        GenerationRequest(messages=MSGS, sampling=SamplingParams(32, temperature=0.0, stop=("Blue",)))
    )
    reqs.append(_req("Count to 9.", n=12, temperature=0.6, seed=9))  # recorded at T = 1 all the same

    async def run():
        client = OpenAIPolicy(vllm_server)
        try:
            return await client.generate_many(reqs), client
        finally:
            await client.aclose()

    comps, client = asyncio.run(run())
    assert client.trainable and client.model == "smollm2"
    hf = HFPolicy("smollm2", dtype="float32", device="cpu")
    local = hf.generate_batch(reqs[:1])[0]
    assert comps[0].prompt_ids == local.prompt_ids and comps[0].output_ids == local.output_ids
    assert max(abs(a - b) for a, b in zip(comps[0].logprobs, local.logprobs, strict=True)) < 1e-3
    for c in comps[1:5]:  # sampled at temperature 1: behaviour log-probs = teacher-forced log-probs
        assert len(c.output_ids) == len(c.logprobs) > 0
        forced = hf.score_logprobs(c.prompt_ids, c.output_ids)
        assert max(abs(a - b) for a, b in zip(c.logprobs, forced, strict=True)) < 1e-3
    stopped = comps[5]
    assert stopped.finish_reason == "stop" and stopped.text.endswith("Blue")
    assert "Blue" in hf.tokenizer.decode(stopped.output_ids)
    cold = comps[6]  # sampled at T = 0.6: behaviour log-probs are still the untempered (trainer's) ones
    forced = hf.score_logprobs(cold.prompt_ids, cold.output_ids)
    assert max(abs(a - b) for a, b in zip(cold.logprobs, forced, strict=True)) < 1e-3


def test_server_without_token_ids_gives_untrainable_completions():
    """A plain OpenAI-style server that rejects vLLM's extras: the client drops them, keeps the text."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            return

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            if "return_token_ids" in body:
                status, payload = (
                    400,
                    {"error": {"message": "Unrecognized request argument supplied: return_token_ids"}},
                )
            else:
                status, payload = (
                    200,
                    {"choices": [{"message": {"content": "plain"}, "finish_reason": "stop"}]},
                )
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()

    async def run():
        client = OpenAIPolicy(f"http://127.0.0.1:{httpd.server_address[1]}", "m")
        try:
            return [await client.generate(_req("hi")) for _ in range(2)], client
        finally:
            await client.aclose()

    try:
        comps, client = asyncio.run(run())
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert [c.text for c in comps] == ["plain", "plain"] and all(c.output_ids == [] for c in comps)
    assert not client.trainable and not client.send_extras
    assert len(seen) == 3  # one rejected request, then two plain ones
