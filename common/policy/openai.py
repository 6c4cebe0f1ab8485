"""``OpenAIPolicy``: any OpenAI-compatible chat server (vLLM, SGLang, llama.cpp, ``serve.py``).

Each request is one ``POST {base_url}/v1/chat/completions`` (httpx, non-streaming) asking for
``logprobs`` of the sampled tokens. Token ids are requested with the extras vLLM understands
(``return_token_ids``, ``return_tokens_as_token_ids``, ``include_stop_str_in_output``; ``serve.py``
answers the same way) and read from wherever the server puts them:

* prompt ids: top-level or per-choice ``prompt_token_ids``;
* output ids: per-choice ``token_ids`` / ``output_token_ids``, else the ``logprobs.content`` entries
  (``"token": "token_id:123"`` or an ``id`` / ``token_id`` field, as llama.cpp sends);
* log-probs: ``logprobs.content[i].logprob``.

When prompt ids, output ids and log-probs are all present (and lengths agree) the Completion is
token-exact and trainable; otherwise its token fields are left empty and ``policy.trainable`` turns
False. If the server rejects the extras (HTTP 400/422 naming them, e.g. the real OpenAI API) they are
dropped for the rest of the session. At most ``max_concurrency`` requests are in flight (a semaphore);
transport errors and 5xx answers are retried ``max_retries`` times with backoff.

Behaviour log-probs: every engine records the raw model's ``log_softmax(logits)`` of the sampled token
(temperature 1, no top-p: the distribution the trainer scores; ``engine.py`` says why). That is vLLM's
default (``--logprobs-mode raw_logprobs``); do NOT start it with ``processed_logprobs``, which records the
temperature-scaled distribution and biases CISPO's ratio whenever the sampling temperature is not 1.
SGLang returns raw log-probs too unless told otherwise.

As an engine (the ``engine.Engine`` surface): ``version`` is the policy version the caller says the
server holds; ``update_weights`` raises, because a server's weights are moved server-side (level 2
pushes them with the server's own update endpoint and then sets ``version``); no sleep/wake here.

With a local ``tokenizer`` the messages are first
shortened to ``max_context_tokens - max_new_tokens`` by ``context.fit_messages``; without one the server
must fit the prompt itself. No streaming.

Example: ``python -m common.policy.openai http://127.0.0.1:8000#smollm2 "Say hi"``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from common.policy.base import Completion, GenerationRequest, Policy, SamplingParams
from common.policy.context import fit_messages

VLLM_EXTRAS: dict[str, Any] = {
    "return_token_ids": True,
    "return_tokens_as_token_ids": True,
    "include_stop_str_in_output": True,
}


class OpenAIServerError(RuntimeError):
    """The server answered with an error (after retries)."""


def _rejects_extras(message: str) -> bool:
    """Is this error a 400 about our vLLM extras (not, e.g., a prompt that is too long)?"""
    low = message.lower()
    if "http 400" not in low and "http 422" not in low:
        return False
    return any(k in low for k in VLLM_EXTRAS) or "unrecognized" in low or "extra" in low


def normalise_base_url(url: str) -> str:
    """``http://h:p``, ``http://h:p/`` or ``http://h:p/v1`` -> ``http://h:p/v1``."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url if url.endswith("/v1") else url + "/v1"


def _token_id(entry: dict[str, Any]) -> int | None:
    for key in ("id", "token_id"):
        if isinstance(entry.get(key), int):
            return int(entry[key])
    tok = entry.get("token")
    if isinstance(tok, str) and tok.startswith("token_id:"):
        try:
            return int(tok.split(":", 1)[1])
        except ValueError:
            return None
    return None


def parse_chat_response(data: dict[str, Any], stop: tuple[str, ...] = ()) -> tuple[Completion, bool]:
    """Turn one chat-completions JSON answer into ``(Completion, token_exact)``."""
    choice = (data.get("choices") or [{}])[0]
    text = ((choice.get("message") or {}).get("content")) or ""
    stop_reason = choice.get("stop_reason")
    if isinstance(stop_reason, str) and stop_reason in stop and not text.endswith(stop_reason):
        text += stop_reason  # servers that cut the stop string off: keep it, as our other backends do
    finish = "length" if choice.get("finish_reason") == "length" else "stop"
    content = ((choice.get("logprobs") or {}).get("content")) or []
    logprobs = [float(e["logprob"]) for e in content if isinstance(e.get("logprob"), (int, float))]
    if len(logprobs) != len(content):
        logprobs = []
    output_ids = choice.get("token_ids") or choice.get("output_token_ids")
    if not output_ids and content:
        ids = [_token_id(e) for e in content]
        output_ids = [i for i in ids if i is not None] if all(i is not None for i in ids) else None
    prompt_ids = data.get("prompt_token_ids") or choice.get("prompt_token_ids")
    exact = bool(prompt_ids) and bool(output_ids) and len(output_ids) == len(logprobs)
    if not exact:
        return Completion(text=text, finish_reason=finish), False
    return (
        Completion(
            text=text,
            prompt_ids=[int(i) for i in prompt_ids],
            output_ids=[int(i) for i in output_ids],
            logprobs=logprobs,
            finish_reason=finish,
        ),
        True,
    )


class OpenAIPolicy(Policy):
    """A policy served by an OpenAI-compatible HTTP server (see the module docstring)."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        api_key: str | None = None,
        max_concurrency: int = 32,
        timeout_s: float = 600.0,
        max_retries: int = 2,
        send_extras: bool = True,
        extra_body: dict[str, Any] | None = None,
        tokenizer: Any = None,
        max_context_tokens: int | None = None,
    ) -> None:
        self.base_url = normalise_base_url(base_url)
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        self.max_concurrency = max(1, int(max_concurrency))
        self.timeout_s = float(timeout_s)
        self.max_retries = max(0, int(max_retries))
        self.send_extras = send_extras
        self.extra_body = dict(extra_body or {})
        self.tokenizer = tokenizer
        self.max_context_tokens = max_context_tokens
        self.trainable = True
        """Turns False as soon as one answer lacks token ids or log-probs."""
        self.version = 0
        """Policy version of the weights the server holds (set by whoever updates the server)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None
        self._sem: asyncio.Semaphore | None = None

    # ------------------------------------------------------------------ plumbing
    def update_weights(self, weights: Any, version: int | None = None) -> float:
        """Not possible from the client: see the module docstring (level 2 updates the server itself)."""
        raise NotImplementedError(
            "an OpenAI-compatible server's weights are updated server-side (level 2); after the server "
            "reloads, set policy.version"
        )

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def _ensure_client(self) -> tuple[Any, asyncio.Semaphore]:
        try:
            import httpx
        except ImportError as exc:  # pragma: no cover - httpx comes with transformers/huggingface_hub
            raise RuntimeError("OpenAIPolicy needs httpx: pip install httpx") from exc
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._loop = loop
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_s, connect=30.0),
                limits=httpx.Limits(max_connections=self.max_concurrency),
                headers=self._headers(),
            )
            self._sem = asyncio.Semaphore(self.max_concurrency)
        assert self._sem is not None
        return self._client, self._sem

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        import httpx

        client, _ = self._ensure_client()
        last: str = ""
        for attempt in range(self.max_retries + 1):
            try:
                resp = await client.request(method, self.base_url + path, json=body)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status_code < 400:
                    return resp.json()
                last = f"HTTP {resp.status_code}: {resp.text[:500]}"
                if resp.status_code < 500:
                    raise OpenAIServerError(f"{method} {self.base_url}{path} -> {last}")
            if attempt < self.max_retries:
                await asyncio.sleep(0.5 * 2**attempt)
        raise OpenAIServerError(f"{method} {self.base_url}{path} failed: {last}")

    async def resolve_model(self) -> str:
        """The model name to send (the first one ``/v1/models`` lists when none was given)."""
        if self.model is None:
            data = await self._request("GET", "/models")
            models = [m.get("id") for m in data.get("data", []) if m.get("id")]
            if not models:
                raise OpenAIServerError(f"{self.base_url}/models lists no model")
            self.model = models[0]
        return self.model

    def _body(self, request: GenerationRequest, messages: list[dict[str, str]], model: str) -> dict[str, Any]:
        sp: SamplingParams = request.sampling
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "max_tokens": int(sp.max_new_tokens),
            "temperature": float(sp.temperature),
            "top_p": float(sp.top_p),
            "logprobs": True,
            "n": 1,
            "stream": False,
        }
        if sp.stop:
            body["stop"] = list(sp.stop)
        if sp.seed is not None:
            body["seed"] = int(sp.seed)
        if self.send_extras:
            body.update(VLLM_EXTRAS)
        body.update(self.extra_body)
        return body

    # ------------------------------------------------------------------ Policy API
    async def generate(self, request: GenerationRequest) -> Completion:
        model = await self.resolve_model()
        messages, truncated = request.messages, False
        if self.tokenizer is not None and self.max_context_tokens:
            budget = self.max_context_tokens - max(1, request.sampling.max_new_tokens)
            messages, _, truncated = fit_messages(self.tokenizer, request.messages, budget)
        _, sem = self._ensure_client()
        async with sem:
            try:
                data = await self._request("POST", "/chat/completions", self._body(request, messages, model))
            except OpenAIServerError as exc:
                if not (self.send_extras and _rejects_extras(str(exc))):
                    raise
                self.send_extras = False  # the server rejects vLLM's extras: do without token ids
                data = await self._request("POST", "/chat/completions", self._body(request, messages, model))
        comp, exact = parse_chat_response(data, tuple(request.sampling.stop))
        if not exact:
            self.trainable = False
        comp.prompt_truncated = truncated
        return comp

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m common.policy.openai URL[#MODEL] [PROMPT]", file=sys.stderr)
        return 2
    url, _, model = argv[0].partition("#")
    prompt = " ".join(argv[1:]) or "Say hello in five words."

    async def run() -> Completion:
        policy = OpenAIPolicy(url, model or None)
        try:
            req = GenerationRequest(
                messages=[{"role": "user", "content": prompt}], sampling=SamplingParams(64, temperature=0)
            )
            return await policy.generate(req)
        finally:
            await policy.aclose()

    comp = asyncio.run(run())
    print(comp.text)
    print(json.dumps({"prompt_ids": len(comp.prompt_ids), "output_ids": len(comp.output_ids)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
