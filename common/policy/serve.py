"""A small OpenAI-compatible server for an ``HFPolicy`` (``/v1/chat/completions`` with token ids).

It answers the subset of the API our ``OpenAIPolicy`` uses, in vLLM's shape, so the same client code
runs against vLLM, SGLang or this server:

* ``GET /v1/models``, ``GET /health``;
* ``POST /v1/chat/completions`` (non-streaming; ``n`` >= 1; ``max_tokens`` / ``max_completion_tokens``,
  ``temperature``, ``top_p``, ``stop``, ``seed``, ``logprobs``). Every answer carries the vLLM extras
  ``prompt_token_ids`` (top level) and ``choices[i].token_ids``; with ``logprobs: true`` each content
  entry holds the behaviour log-prob, and ``"token": "token_id:N"`` when ``return_tokens_as_token_ids``
  is set. The stop string is kept in the text (as ``include_stop_str_in_output``); ``stop_reason`` names it.

Concurrency: stdlib ``ThreadingHTTPServer`` threads hand requests to one asyncio loop in a background
thread, where ``HFPolicy``'s batching queue groups concurrent HTTP requests into one model batch.
Simplifications: no streaming, no tools/function calling, no auth, ``top_logprobs`` ignored.

Run: ``python -m common.policy.serve --model smollm2 --port 8000`` then
``python -m common.policy.openai http://127.0.0.1:8000 "Say hi"``. In code: ``start_server(policy)``
returns a running :class:`PolicyServer` (``.url``, ``.close()``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from common.policy.base import Completion, GenerationRequest, Policy, SamplingParams


class _BadRequest(ValueError):
    pass


def _request_from_body(body: dict[str, Any]) -> GenerationRequest:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("'messages' must be a non-empty list")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _BadRequest("each message needs a string 'role'")
        if not isinstance(m.get("content", ""), str):
            raise _BadRequest("only string message contents are supported")
    if body.get("stream"):
        raise _BadRequest("streaming is not supported")
    stop = body.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 512
    temperature = body.get("temperature")
    sampling = SamplingParams(
        max_new_tokens=int(max_tokens),
        temperature=1.0 if temperature is None else float(temperature),
        top_p=float(body.get("top_p") or 1.0),
        stop=tuple(str(s) for s in stop),
        seed=None if body.get("seed") is None else int(body["seed"]),
    )
    msgs = [{"role": m["role"], "content": m.get("content", "")} for m in messages]
    return GenerationRequest(messages=msgs, sampling=sampling)


def _choice(index: int, comp: Completion, body: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    sp_stop = body.get("stop") or ()
    stops = (sp_stop,) if isinstance(sp_stop, str) else tuple(sp_stop)
    stop_reason: Any = None
    if comp.finish_reason == "stop":
        hit = [s for s in stops if s and comp.text.endswith(s)]
        stop_reason = hit[0] if hit else None
    choice: dict[str, Any] = {
        "index": index,
        "message": {"role": "assistant", "content": comp.text},
        "finish_reason": comp.finish_reason if comp.finish_reason in ("stop", "length") else "stop",
        "stop_reason": stop_reason,
        "token_ids": list(comp.output_ids),
        "logprobs": None,
    }
    if body.get("logprobs"):
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        content = []
        for tid, lp in zip(comp.output_ids, comp.logprobs, strict=True):
            piece = tokenizer.decode([tid]) if tokenizer is not None else ""
            content.append(
                {
                    "token": f"token_id:{tid}" if as_ids else piece,
                    "logprob": lp,
                    "bytes": list(piece.encode("utf-8")),
                    "top_logprobs": [],
                }
            )
        choice["logprobs"] = {"content": content}
    return choice


class PolicyServer:
    """A running server: ``url`` (``http://host:port``), ``close()``."""

    def __init__(self, policy: Policy, host: str = "127.0.0.1", port: int = 0, model_name: str = "sera"):
        self.policy = policy
        self.model_name = model_name
        self.tokenizer = getattr(policy, "tokenizer", None)
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, name="serve-loop", daemon=True)
        self._loop_thread.start()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet by default
                return

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status: int, message: str) -> None:
                self._send(status, {"error": {"message": message, "type": "invalid_request_error"}})

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                if self.path.rstrip("/") in ("/v1/models", "/models"):
                    self._send(
                        200,
                        {"object": "list", "data": [{"id": server.model_name, "object": "model"}]},
                    )
                elif self.path.rstrip("/") in ("/health", ""):
                    self._send(200, {"status": "ok"})
                else:
                    self._error(404, f"no route {self.path}")

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                    self._error(404, f"no route {self.path}")
                    return
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                    body = json.loads(self.rfile.read(length) or b"{}")
                    if not isinstance(body, dict):
                        raise _BadRequest("the body must be a JSON object")
                    req = _request_from_body(body)
                    n = int(body.get("n") or 1)
                    if not 1 <= n <= 64:
                        raise _BadRequest("n must be in 1..64")
                except (ValueError, TypeError) as exc:
                    self._error(400, str(exc))
                    return
                try:
                    comps = server.generate(req, n)
                except Exception as exc:  # report model errors to the client as a 500
                    self._error(500, f"{type(exc).__name__}: {exc}")
                    return
                prompt_ids = comps[0].prompt_ids
                completion_tokens = sum(len(c.output_ids) for c in comps)
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": server.model_name,
                        "choices": [_choice(i, c, body, server.tokenizer) for i, c in enumerate(comps)],
                        "prompt_token_ids": list(prompt_ids),
                        "usage": {
                            "prompt_tokens": len(prompt_ids),
                            "completion_tokens": completion_tokens,
                            "total_tokens": len(prompt_ids) + completion_tokens,
                        },
                    },
                )

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.host, self.port = self.httpd.server_address[:2]
        self._http_thread = threading.Thread(target=self.httpd.serve_forever, name="serve-http", daemon=True)
        self._http_thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def generate(self, request: GenerationRequest, n: int = 1) -> list[Completion]:
        """Run ``n`` copies of ``request`` on the server loop (blocking the calling HTTP thread)."""
        reqs = [request]
        for k in range(1, n):
            sp = request.sampling
            seed = None if sp.seed is None else sp.seed + k
            sampling = SamplingParams(sp.max_new_tokens, sp.temperature, sp.top_p, sp.stop, seed)
            reqs.append(GenerationRequest(messages=request.messages, sampling=sampling))
        fut = asyncio.run_coroutine_threadsafe(self.policy.generate_many(reqs), self.loop)
        return fut.result()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(timeout=5)

    def __enter__(self) -> PolicyServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_server(
    policy: Policy, host: str = "127.0.0.1", port: int = 0, model_name: str = "sera"
) -> PolicyServer:
    """Serve ``policy`` on ``host:port`` (0 = a free port) in background threads."""
    return PolicyServer(policy, host, port, model_name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2 | tiny | HF id | local path")
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--dtype", default=None, help="bfloat16 (default) | float32 | float16")
    ap.add_argument("--device", default=None)
    ap.add_argument("--max-batch-size", type=int, default=8)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--max-context-tokens", type=int, default=None)
    args = ap.parse_args(argv)
    from common.policy.hf import HFPolicy

    policy = HFPolicy(
        args.model,
        dtype=args.dtype,
        device=args.device,
        max_batch_size=args.max_batch_size,
        max_wait_ms=args.max_wait_ms,
        max_context_tokens=args.max_context_tokens,
    )
    server = start_server(policy, args.host, args.port, args.served_model_name or args.model)
    print(f"serving {args.model} at {server.url}/v1 (Ctrl-C to stop)", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
