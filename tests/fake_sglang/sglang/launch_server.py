"""Fake ``python -m sglang.launch_server``: the slice of SGLang's HTTP server that level 2 uses, written from
SGLang's source (sgl-project/sglang: ``srt/entrypoints/http_server.py``, ``srt/managers/io_struct.py``,
``srt/utils`` ``init_custom_process_group``, ``ModelRunner.init_weights_update_group`` /
``update_weights_from_distributed``), on a transformers model on CPU. What it reproduces, because level 2
depends on it:

* command-line flags (unknown flags fail, as SGLang's argparse does): --model-path --dtype --host --port
  --max-running-requests --random-seed --mem-fraction-static --enable-deterministic-inference;
* log-probs are of the TEMPERATURE-SCALED distribution unless ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is set;
* ``sampling_seed`` is honoured only with ``--enable-deterministic-inference``;
* ``/get_model_info`` has no ``max_total_num_tokens``; ``/get_server_info`` has it in ``internal_states``;
* ``/generate``: ``input_ids``, ``sampling_params``, ``return_logprob``, ``logprob_start_len``;
  ``meta_info.output_token_logprobs`` / ``input_token_logprobs`` as ``[logprob, token_id, text]``;
  ``finish_reason`` ``{"type": "length" | "stop"}``;
* the weight-update group: ``init_custom_process_group`` = tcp rendezvous + ``PrefixStore(group_name)`` +
  ``_new_process_group_helper``, rank = ``rank_offset``; tensors received by ``broadcast(src=0)`` in the
  order of ``names``; ``/update_weights_from_disk`` reads ``model_path``.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from aiohttp import web

POOL_TOKENS = 4096
"""The fake's KV pool (``max_total_num_tokens``), below tiny models' 8192-token window: the client must take it."""


def init_custom_process_group(backend, init_method, world_size, rank, group_name, timeout=None):
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        rendezvous,
    )

    timeout = timeout or timedelta(minutes=10)
    store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    params = inspect.signature(_new_process_group_helper).parameters
    opts = {"backend_options": None} if "backend_options" in params else {"pg_options": None}
    pg, _ = _new_process_group_helper(world_size, rank, [], Backend(backend), store, group_name=group_name,
                                      timeout=timeout, **opts)  # fmt: skip
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def main() -> None:
    ap = argparse.ArgumentParser()
    for flag in ("--model-path", "--dtype", "--host"):
        ap.add_argument(flag, required=flag == "--model-path")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--max-running-requests", type=int)
    ap.add_argument("--random-seed", type=int, default=0)
    ap.add_argument("--mem-fraction-static", type=float)
    ap.add_argument("--enable-deterministic-inference", action="store_true")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype or "float32")
    model = AutoModelForCausalLM.from_pretrained(args.model_path, dtype=dtype).eval()
    tok = AutoTokenizer.from_pretrained(args.model_path)
    raw = bool(os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB"))
    groups: dict[str, object] = {}
    lock = threading.Lock()
    rng = torch.Generator().manual_seed(args.random_seed)

    def tensors():
        own = dict(model.state_dict(keep_vars=True))
        own.update(dict(model.named_parameters()))
        return own

    def run_generate(body):
        ids = list(body["input_ids"])
        sp = body.get("sampling_params") or {}
        n, temp = int(sp.get("max_new_tokens", 128)), float(sp.get("temperature", 1.0))
        gen = rng
        if "sampling_seed" in sp and args.enable_deterministic_inference:
            gen = torch.Generator().manual_seed(int(sp["sampling_seed"]))
        start = int(body.get("logprob_start_len", -1))
        meta: dict = {"prompt_tokens": len(ids)}
        with lock, torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
            if body.get("return_logprob") and start >= 0:
                logp = torch.log_softmax(logits, -1)
                meta["input_token_logprobs"] = [
                    [None if i == 0 else float(logp[i - 1, ids[i]]), ids[i], None]
                    for i in range(start, len(ids))
                ]
            out, lps, finish = [], [], "length"
            last = logits[-1]
            for _ in range(n):
                scaled = last / temp if temp > 0 else last
                tok_id = int(torch.argmax(last)) if temp <= 0 else int(
                    torch.multinomial(torch.softmax(scaled, -1), 1, generator=gen))  # fmt: skip
                dist_ = last if (raw or temp <= 0) else scaled
                lps.append(float(torch.log_softmax(dist_, -1)[tok_id]))
                out.append(tok_id)
                if tok_id == tok.eos_token_id and not sp.get("ignore_eos"):
                    finish = "stop"
                    break
                last = model(input_ids=torch.tensor([ids + out])).logits[0, -1].float()
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(lps, out, strict=True)]
        meta["finish_reason"] = {"type": finish}
        meta["completion_tokens"] = len(out)
        return {"text": tok.decode(out), "output_ids": out, "meta_info": meta}

    def run_init_group(body):
        groups[body.get("group_name", "weight_update_group")] = init_custom_process_group(
            body.get("backend", "nccl"), f"tcp://{body['master_address']}:{body['master_port']}",
            int(body["world_size"]), int(body["rank_offset"]), body.get("group_name", "weight_update_group"))  # fmt: skip
        return {"success": True, "message": "Succeeded to initialize custom process group."}

    def run_update_distributed(body):
        pg = groups[body.get("group_name", "weight_update_group")]
        own = tensors()
        received = []
        for name, dt, shape in zip(body["names"], body["dtypes"], body["shapes"], strict=True):
            buf = torch.empty(shape, dtype=getattr(torch, dt))
            dist.broadcast(buf, src=0, group=pg)
            received.append((name, buf))
        with lock, torch.no_grad():
            for name, buf in received:
                own[name].copy_(buf)
        return {"success": True, "message": "Succeeded to update parameter online."}

    def run_update_disk(body):
        from safetensors.torch import load_file

        own = tensors()
        with lock, torch.no_grad():
            for name, t in load_file(os.path.join(body["model_path"], "model.safetensors")).items():
                own[name].copy_(t)
        return {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}

    def handler(fn):
        async def h(req):
            body = await req.json()
            return web.json_response(await asyncio.to_thread(fn, body))

        return h

    async def health(_):
        return web.Response(text="")

    async def model_info(_):
        return web.json_response(
            {"model_path": args.model_path, "tokenizer_path": args.model_path, "is_generation": True}
        )

    async def server_info(_):
        return web.json_response({"model_path": args.model_path, "context_length": None, "random_seed": args.random_seed,
                                  "internal_states": [{"max_total_num_tokens": POOL_TOKENS}]})  # fmt: skip

    app = web.Application(client_max_size=1 << 30)
    app.add_routes([web.get("/health", health), web.get("/get_model_info", model_info),
                    web.get("/get_server_info", server_info), web.post("/generate", handler(run_generate)),
                    web.post("/init_weights_update_group", handler(run_init_group)),
                    web.post("/update_weights_from_distributed", handler(run_update_distributed)),
                    web.post("/update_weights_from_disk", handler(run_update_disk))])  # fmt: skip
    web.run_app(app, host=args.host or "127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
