"""The generation-engine interface: what a trainer needs from whatever produces its rollouts.

A *policy* (``base.Policy``) turns chats into token-exact completions. An *engine* is a trainable policy
whose weights the trainer owns and replaces after every optimizer step:

* ``generate_batch(requests) -> completions`` (synchronous, one batch) and the async
  ``generate(request)`` that agents await; concurrent ``generate`` calls meet in :class:`BatchQueue`
  and run as one batch on a worker thread, so the asyncio loop stays free while the model runs (an
  engine with continuous batching takes later calls into the running batch: :class:`Feed`);
* every completion holds ``prompt_ids`` (built by ``context.build_prompt_ids``, the same code in every
  engine, so the same chat gives the same prompt ids everywhere), ``output_ids`` and ``logprobs``: the
  behaviour log-probs of exactly the sampled tokens under the **raw model distribution**
  ``log_softmax(logits)`` (temperature 1, no top-p), i.e. the distribution the trainer scores
  (``common.rl.loss.token_logprobs``). Sampling itself may use any temperature / top-p; only what is
  *recorded* is the untempered log-prob. Why: CISPO's ratio ``pi_theta / pi_behaviour`` must be 1 when
  the trainer's weights equal the sampler's, whatever the sampling temperature; a tempered behaviour
  log-prob would bias every ratio at ``T != 1`` (docs/fidelity/engines.md). It is also vLLM's default
  (``logprobs_mode="raw_logprobs"``);
* ``update_weights(weights, version)`` loads new weights in memory (no restart) and returns the seconds
  it took; ``version`` (completed optimizer steps of the weights held) is recorded by the caller;
* ``sleep()`` / ``wake()`` free and restore the engine's accelerator memory around a training step
  where the engine supports it (``supports_sleep``); elsewhere they are no-ops.

Engines: ``hf.HFPolicy`` (the reference: our own batched decode loop on the training model itself),
``openai.OpenAIPolicy`` (a server: vLLM / SGLang / ``serve.py``; weights move server-side, level 2) and
the in-process vLLM engine of level 1 (``level1_batched/vllm_engine.py``; ``common/`` never imports
vLLM). Pure Python: nothing here imports torch.
"""

from __future__ import annotations

import asyncio
import threading
import time
from abc import abstractmethod
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from common import stop
from common.policy.base import Completion, GenerationRequest, Policy
from common.policy.context import build_prompt_ids

Weights = Mapping[str, Any] | Iterable[tuple[str, Any]]
"""A ``state_dict``-like mapping or an iterable of ``(name, tensor)`` pairs, in Hugging Face names."""


FINGERPRINT_CHUNK = 1 << 24
"""Elements cast to float64 at a time by :func:`weights_fingerprint` (128 MB of float64 at most)."""


def weights_fingerprint(tensors: Iterable[Any]) -> tuple[int, float, float]:
    """``(elements, sum, sum of squares)`` of the tensors' values, summed in float64.

    The same for any split or concatenation of the same values, so an engine that fuses tensors (vLLM's
    ``qkv_proj``, ``gate_up_proj``) has the fingerprint of the trainer's separate ones; a tensor left out or
    stale changes it. Tensor methods only (no torch import here).

    >>> import torch
    >>> a, b = torch.arange(6.0).reshape(2, 3), torch.tensor([[-1.0, 2.0, 0.5]])
    >>> weights_fingerprint([a, b]) == weights_fingerprint([torch.cat([a, b])]) == (9, 16.5, 60.25)
    True
    """
    n, total, squares = 0, 0.0, 0.0
    for t in tensors:
        for part in t.detach().reshape(-1).split(FINGERPRINT_CHUNK):
            d = part.double()
            n += d.numel()
            total += float(d.sum())
            squares += float(d.dot(d))
    return n, total, squares


def fingerprint_gap(served: tuple[int, float, float] | None, want: tuple[int, float, float] | None) -> float:
    """How far the engine's weights (``served``) are from the trainer's (``want``): the relative difference of
    the sums of squares plus that of the sums (scaled by ``sqrt(n * sum of squares)``, their Cauchy-Schwarz
    bound). 0 up to float64 rounding (~1e-15) when both hold the same values; NaN when either is unknown
    (``None``: an engine whose weights cannot be read) or the element counts differ (not the same tensors).

    >>> fingerprint_gap((9, 16.5, 60.25), (9, 16.5, 60.25)), fingerprint_gap((8, 1.0, 1.0), (9, 1.0, 1.0))
    (0.0, nan)
    >>> round(fingerprint_gap((4, 2.0, 4.0), (4, 2.0, 5.0)), 3)
    0.2
    """
    if served is None or want is None or served[0] != want[0]:
        return float("nan")
    n, total, squares = want
    scale = max(squares, 1e-300)
    return abs(served[2] - squares) / scale + abs(served[1] - total) / max((n * scale) ** 0.5, 1e-300)


def find_stop(text: str, stops: tuple[str, ...] | list[str]) -> int:
    """End index (exclusive) of the earliest-ending stop string in ``text``, or -1.

    >>> find_stop("say <finish>done</finish> more", ("</finish>", "<finish>"))
    12
    """
    best = -1
    for s in stops:
        if not s:
            continue
        i = text.find(s)
        if i >= 0 and (best < 0 or i + len(s) < best):
            best = i + len(s)
    return best


def prompt_for(tokenizer: Any, request: GenerationRequest, max_context_tokens: int) -> tuple[list[int], bool]:
    """``(prompt ids, truncated?)`` of ``request`` within ``max_context_tokens - max_new_tokens``: the one
    prompt rule of every local engine (chat template + oldest-turn dropping, ``context.py``)."""
    budget = max_context_tokens - max(1, request.sampling.max_new_tokens)
    if budget < 1:
        raise ValueError(
            f"max_new_tokens={request.sampling.max_new_tokens} leaves no room for a prompt in "
            f"max_context_tokens={max_context_tokens}"
        )
    return build_prompt_ids(tokenizer, request.messages, budget)


def completion_text(tokenizer: Any, output_ids: list[int], stops: tuple[str, ...]) -> tuple[str, bool]:
    """``(text, stopped?)``: the decoded output (special tokens skipped) cut right after the earliest stop
    string (kept). The same rule in every local engine, so texts agree whenever token ids agree."""
    text = tokenizer.decode(output_ids, skip_special_tokens=True)
    end = find_stop(text, stops) if stops else -1
    return (text[:end], True) if end >= 0 else (text, False)


def named_weights(weights: Weights) -> list[tuple[str, Any]]:
    """``weights`` as a list of ``(name, tensor)`` pairs (a mapping's items, or the pairs as given)."""
    if isinstance(weights, Mapping):
        return list(weights.items())
    pairs = list(weights)
    for p in pairs[:1]:
        if not (isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)):
            raise TypeError(
                f"weights must be a mapping or (name, tensor) pairs, got an item {type(p).__name__}"
            )
    return pairs


@dataclass
class _LoopState:
    loop: asyncio.AbstractEventLoop
    pending: list[tuple[GenerationRequest, asyncio.Future]] = field(default_factory=list)
    full: asyncio.Event = field(default_factory=asyncio.Event)
    runner: asyncio.Task | None = None


class Feed:
    """What a running batch sees of its queue, from the engine's worker thread (continuous batching):
    ``take(n)`` removes up to ``n`` requests that arrived since the batch started, as ``(handle, request)``
    pairs; ``finish(handle, result)`` hands that caller its ``Completion`` (or exception) at once, while the
    batch goes on. The first requests of the batch have handles ``0 .. len(requests) - 1``."""

    def __init__(self, queue: BatchQueue, st: _LoopState, futures: list[asyncio.Future]) -> None:
        self._queue, self._st, self.futures = queue, st, list(futures)

    def take(self, n: int) -> list[tuple[int, GenerationRequest]]:
        got = self._queue._pop(self._st, n)
        out = []
        for request, fut in got:
            self.futures.append(fut)
            out.append((len(self.futures) - 1, request))
        return out

    def finish(self, handle: int, result: Completion | BaseException) -> None:
        self._st.loop.call_soon_threadsafe(_resolve, self.futures[handle], result)

    stopped = stop.Stopped
    """What a caller gets when a stop request ends its call (it leaves the event loop by itself)."""

    def wanted(self, handle: int) -> bool:
        """Whether the caller still waits (not cut by a deadline, cancelled, or gone with its tree): an
        engine stops decoding a row nobody waits for."""
        return not self.futures[handle].done()


class ListFeed:
    """A :class:`Feed` for a fixed list of requests (the synchronous ``generate_batch``): nothing arrives
    later; ``results[handle]`` collects what ``finish`` hands over."""

    def __init__(self, n: int) -> None:
        self.results: list[Completion | BaseException | None] = [None] * n

    def take(self, n: int) -> list[tuple[int, GenerationRequest]]:
        return []

    def finish(self, handle: int, result: Completion | BaseException) -> None:
        self.results[handle] = result

    stopped = KeyboardInterrupt
    """The synchronous ``generate_batch`` raises the stop in its caller's thread."""

    def wanted(self, handle: int) -> bool:
        return True


def _resolve(fut: asyncio.Future, result: Completion | BaseException) -> None:
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)


class BatchQueue:
    """Collects concurrent ``await submit(request)`` calls into batches run on ONE worker thread: a batch
    starts when ``max_batch_size`` requests wait or ``max_wait_ms`` passed since the first.

    Two kinds of engine: ``run_batch(requests)`` (sync) returns one ``Completion | Exception`` per request
    when the whole batch is done, and requests arriving meanwhile form the next batch (vLLM schedules
    inside its own engine); ``run_continuous(requests, feed)`` (continuous batching, ``HFPolicy``) takes
    the requests that arrive while it decodes (:class:`Feed`) into the running batch and hands every
    caller its result as soon as its row is done. An exception fails only its own caller."""

    def __init__(
        self, run_batch, max_batch_size: int, max_wait_ms: float, name: str = "engine", run_continuous=None
    ) -> None:
        self.run_batch = run_batch
        self.run_continuous = run_continuous
        self.max_batch_size = max(1, int(max_batch_size))
        self.max_wait_ms = float(max_wait_ms)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._state: _LoopState | None = None
        self._lock = threading.Lock()  # ``pending`` is appended on the loop and popped on the worker thread

    async def submit(self, request: GenerationRequest) -> Completion:
        loop = asyncio.get_running_loop()
        if self._state is None or self._state.loop is not loop:
            self._state = _LoopState(loop=loop)
        st = self._state
        fut: asyncio.Future = loop.create_future()
        with self._lock:
            st.pending.append((request, fut))
            full = len(st.pending) >= self.max_batch_size
        if full:
            st.full.set()
        if st.runner is None or st.runner.done():
            st.runner = loop.create_task(self._runner(st))
        return await fut

    def _pop(self, st: _LoopState, n: int) -> list[tuple[GenerationRequest, asyncio.Future]]:
        """Up to ``n`` waiting requests whose callers still wait (any thread)."""
        with self._lock:
            got, st.pending = st.pending[:n], st.pending[n:]
        return [(r, f) for r, f in got if not f.done()]

    async def _runner(self, st: _LoopState) -> None:
        while st.pending:
            stop.check()  # a stop request not taken up yet leaves the loop (common/stop.py)
            if len(st.pending) < self.max_batch_size and self.max_wait_ms > 0:
                st.full.clear()
                try:
                    await asyncio.wait_for(st.full.wait(), self.max_wait_ms / 1000.0)
                except asyncio.TimeoutError:
                    pass
            batch = self._pop(st, self.max_batch_size)
            if not batch:
                continue
            if self.run_continuous is not None:
                feed = Feed(self, st, [f for _, f in batch])
                try:
                    await st.loop.run_in_executor(
                        self._executor, self.run_continuous, [r for r, _ in batch], feed
                    )
                except Exception as exc:  # an engine error: fail every caller still waiting, keep serving
                    for f in feed.futures:
                        _resolve(f, exc)
                for f in feed.futures:  # an engine that forgot a caller must not hang it
                    _resolve(f, RuntimeError("the engine finished its batch without this request's result"))
                continue
            try:
                results = await st.loop.run_in_executor(self._executor, self.run_batch, [r for r, _ in batch])
            except Exception as exc:  # an engine error: fail every waiter of this batch, keep serving
                results = [exc] * len(batch)
            for (_, f), res in zip(batch, results, strict=True):
                _resolve(f, res)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)


class Engine(Policy):
    """A trainable policy with replaceable weights (see the module docstring). Subclasses implement
    ``_run_batch`` (one batch, one result or exception per request) and ``_load_weights``."""

    trainable = True
    supports_sleep: bool = False
    """True when ``sleep()`` really frees accelerator memory."""

    def __init__(self, max_batch_size: int = 8, max_wait_ms: float = 5.0) -> None:
        self.version = 0
        """Policy version of the weights held: completed optimizer steps (set by ``update_weights``)."""
        self.asleep = False
        self.queue = BatchQueue(
            self._run_batch, max_batch_size, max_wait_ms, name=self.name, run_continuous=self._run_continuous
        )
        self.stats: dict[str, float] = {"batches": 0, "requests": 0, "generated_tokens": 0}

    # ------------------------------------------------------------------ generation
    @property
    def max_batch_size(self) -> int:
        return self.queue.max_batch_size

    @property
    def max_wait_ms(self) -> float:
        return self.queue.max_wait_ms

    @abstractmethod
    def _run_batch(self, requests: list[GenerationRequest]) -> list[Completion | Exception]:
        """Generate one batch (worker thread); a request that cannot be served gets its exception."""

    _run_continuous = None
    """An engine with continuous batching overrides this with ``(requests, feed) -> None`` (:class:`Feed`)."""

    async def generate(self, request: GenerationRequest) -> Completion:
        return await self.queue.submit(request)

    def generate_batch(self, requests: list[GenerationRequest]) -> list[Completion]:
        """Run ``requests`` as one batch, synchronously; the first failed request raises."""
        results = self._run_batch(requests)
        for res in results:
            if isinstance(res, BaseException):
                raise res
        return results  # type: ignore[return-value]

    # ------------------------------------------------------------------ weights and memory
    @abstractmethod
    def _load_weights(self, pairs: list[tuple[str, Any]]) -> None:
        """Copy ``(HF name, tensor)`` pairs into the engine's model."""

    def update_weights(self, weights: Weights | None, version: int | None = None) -> float:
        """Load ``weights`` (HF names; ``None`` = the engine shares the trainer's model, nothing to copy)
        and set ``version`` (default: previous + 1). Returns the seconds the load took."""
        t = time.perf_counter()
        if weights is not None:
            self._load_weights(named_weights(weights))
        self.version = self.version + 1 if version is None else int(version)
        return time.perf_counter() - t

    def weights_fingerprint(self) -> tuple[int, float, float] | None:
        """:func:`weights_fingerprint` of the weights this engine serves (its model's parameters), or None
        where they cannot be read. The weight-sync check compares it with the trainer's."""
        model = getattr(self, "model", None)
        return None if model is None else weights_fingerprint(model.parameters())

    def sleep(self) -> None:
        """Free accelerator memory (weights and KV cache) until ``wake()``; a no-op where unsupported."""
        self.asleep = True

    def wake(self) -> None:
        """Undo ``sleep()``."""
        self.asleep = False

    async def aclose(self) -> None:
        self.queue.shutdown()
