"""``HFPolicy``: batched generation with a local transformers model (the trainable backend).

Concurrent ``await policy.generate(request)`` calls from many asyncio agents are collected by a small
batching queue (up to ``max_batch_size`` requests, waiting at most ``max_wait_ms`` for the batch to
fill) and run together as ONE left-padded batch on a single worker thread, so the event loop stays
responsive while the model runs. Continuous batching: requests that arrive while the batch decodes are
prefilled between two decode steps and merged into it (a new KV cache holding both, right-aligned), and
each caller gets its completion as soon as its own row is done; an agent whose reply ended runs its cell
and is back with its next call while its siblings still decode, instead of waiting for the longest row.

The sampling loop is our own (prefill + KV-cache decode; on a CPU into a ``StaticCache`` sized for the
batch's prompt and reply budget, written in place: a ``DynamicCache`` concatenates, re-copying the whole
cache every step, and made a SmolLM2 bf16 decode step 1.5x slower at batch 1 and 3x at batch 4 on 2 cores)
so that every row can have its own sampling parameters (temperature, top-p, max_new_tokens, stop strings,
seed) and so that the behaviour log-probs are taken from exactly the logits used for sampling:

* temperature 0 = greedy (argmax); temperature T > 0: inverse-CDF sampling from ``softmax(logits / T)``
  (top-p filtered and renormalised when ``top_p < 1``) with one uniform draw per token from the
  request's own generator (seeded by ``SamplingParams.seed``, so a seeded request samples the same
  tokens whatever batch it lands in); all of this runs batched on the model's device, one host
  transfer per step;
* the recorded behaviour log-prob is ALWAYS the raw ``log_softmax(logits)`` of the sampled token
  (temperature 1, no top-p): the distribution the trainer scores, so CISPO's ratio is exactly 1 when
  the weights have not moved, whatever the sampling temperature (``engine.py``, docs/fidelity/engines.md);
* left padding with an attention mask and explicit position ids (``cumsum(mask) - 1``), so a prompt
  gives the same greedy tokens alone or inside a batch; finished rows are removed from the batch and
  the KV cache;
* ``output_ids`` run up to and including EOS or the token that completes a stop string. ``text`` is
  the decoded output (special tokens skipped) cut right after the stop string (the stop string is kept);
  when a stop string ends inside a token, ``output_ids`` may decode to a few more characters than ``text``.

``score_logprobs(prompt_ids, output_ids)`` gives teacher-forced log-probs (tests; the trainer has its own).
As an engine (``engine.Engine``): ``update_weights(None)`` only bumps ``version`` when the policy wraps
the trainer's own model (levels 0 and 1 share one model object); ``update_weights(state_dict)`` copies
tensors in by name (``state_dict()`` names, tied aliases included). No ``sleep`` (the model is the trainer's).
Decode modes (``decode=``; ``SERA_HF_DECODE`` overrides it): ``hf`` is the loop above on transformers'
caches; ``slots`` and ``graphs`` keep one KV slot per row and drive the model's decoder layers themselves,
``graphs`` replaying each batch size's step as a CUDA graph (``common/policy/slots.py``: on a GPU the eager
step is host-bound, ~7,000 Python calls a step). ``auto``: ``graphs`` on CUDA for the Llama family
(SmolLM2), ``hf`` elsewhere and on a CPU (where compute, not Python, is the cost).

Simplifications: no paged KV cache (a merge copies the running batch's cache once), no speculative
decoding, no prefix caching. Prompt over ``max_context_tokens - max_new_tokens`` is
shortened by ``context.build_prompt_ids``.

Try it: ``python -m common.policy.hf "Say hello"`` (SmolLM2 on the CPU).
"""

from __future__ import annotations

import inspect
import math
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from common import stop
from common.memory import trim_memory_every
from common.policy.base import Completion, GenerationRequest, SamplingParams
from common.policy.engine import Engine, ListFeed, find_stop, prompt_for
from common.policy.models import DEFAULT_MODEL, load_model
from common.policy.slots import SlotDecoder, slot_decode_unsupported

__all__ = [
    "DECODE_MODES",
    "EngineOutOfMemory",
    "HFPolicy",
    "decode_metrics",
    "find_engine",
    "find_stop",
    "named_tensors",
    "release_engine_cache",
]


class EngineOutOfMemory(ValueError):
    """What the hf engine hands every caller once its decoding ran out of GPU memory (``rows``: the model calls
    it was decoding together; ``note``: what the process held then). A ValueError, so a command shows it as
    one line; a tier's loop turns it into the run's line naming its settings
    (``common.run.trainer_memory.generation_oom``)."""

    def __init__(self, message: str, rows: int = 0, note: str = "") -> None:
        super().__init__(message)
        self.rows, self.note = rows, note


DECODE_MODES = ("auto", "hf", "slots", "graphs")
"""How the hf engine decodes (``HFPolicy(decode=...)``, the ``SERA_HF_DECODE`` environment variable):
``hf`` transformers' caches, ``slots`` one KV slot per row, ``graphs`` slots with each step a CUDA graph."""


def decode_mode(asked: str, model: Any, device: torch.device) -> str:
    """The decode mode an engine on ``device`` uses for ``asked`` (``SERA_HF_DECODE`` wins when set):
    ``auto`` -> ``graphs`` on CUDA when the slot decoder drives the model, else ``hf``. A mode the model or
    device cannot take is refused in one line."""
    mode = (os.environ.get("SERA_HF_DECODE") or asked or "auto").strip()
    if mode not in DECODE_MODES:
        raise ValueError(f"decode mode must be one of {', '.join(DECODE_MODES)}, not {mode!r}")
    why = slot_decode_unsupported(model)
    if mode == "auto":
        return "graphs" if device.type == "cuda" and why is None else "hf"
    if mode in ("slots", "graphs") and why is not None:
        raise ValueError(f"decode mode {mode}: {why}; use hf")
    if mode == "graphs" and device.type != "cuda":
        raise ValueError(f"decode mode graphs needs CUDA (the model is on {device.type}); use slots or hf")
    return mode


def named_tensors(model: Any) -> dict[str, torch.Tensor]:
    """Every name a weight update may use for ``model``'s tensors: its parameters and buffers AND the
    aliases ``state_dict()`` adds for tied weights (a model with ``tie_word_embeddings``, as SmolLM2 and
    Qwen3-4B, lists ``lm_head.weight`` in ``state_dict()`` but only ``model.embed_tokens.weight`` in
    ``named_parameters()``; both names are the same tensor, so loading either is the same copy)."""
    own = dict(model.state_dict(keep_vars=True))
    own.update(dict(model.named_parameters()))
    own.update(dict(model.named_buffers()))
    return own


@dataclass
class _Row:
    """Decoding state of one request inside a batch."""

    index: int
    request: GenerationRequest
    prompt_ids: list[int]
    truncated: bool
    generator: torch.Generator | None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "length"
    text: str | None = None


@dataclass
class _Batch:
    """The running batch: its rows, their KV cache and attention mask ``[B, width]`` (left padding; a
    row's tokens end at column ``width``, where the next token goes)."""

    rows: list[_Row]
    cache: Any
    mask: torch.Tensor
    width: int


def _first_used(mask: torch.Tensor) -> int:
    """The first column any row of ``mask`` ``[B, T]`` attends to (the columns before it are padding)."""
    used = mask.any(dim=0).nonzero()
    return int(used[0]) if len(used) else mask.shape[1]


def _kv(a: _Batch, b: _Batch):
    """Per layer, the keys and values ``[B, H, width, D]`` of two batches' transformers caches (static or
    dynamic): ``(keys_a, values_a, keys_b, values_b)``."""
    for la, lb in zip(a.cache.layers, b.cache.layers, strict=True):
        yield (
            la.keys[:, :, : a.width],
            la.values[:, :, : a.width],
            lb.keys[:, :, : b.width],
            lb.values[:, :, : b.width],
        )


def _top_p_filter(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Rows of ``logits`` ``(B, V)`` with everything outside the smallest set of cumulative probability
    >= ``top_p[b]`` set to -inf (the most likely token is always kept)."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    cum = torch.cumsum(probs, dim=-1)
    remove = (cum - probs) >= top_p.unsqueeze(-1)  # keep a token while the mass before it is < top_p
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


class HFPolicy(Engine):
    """Local transformers model with batched, token-exact generation (see module docstring)."""

    name = "hf"
    trainable = True

    def __init__(
        self,
        model: str | Any = DEFAULT_MODEL,
        tokenizer: Any = None,
        *,
        dtype: str | torch.dtype | None = None,
        device: str | torch.device | None = None,
        max_batch_size: int = 8,
        max_wait_ms: float = 5.0,
        max_context_tokens: int | None = None,
        seed: int = 0,
        adapter: str | None = None,
        kv_cache: str = "auto",
        continuous: bool = True,
        prefill_tokens: int | None = None,
        decode: str = "auto",
    ) -> None:
        """``model``: a name for ``models.load_model`` (``smollm2``, ``tiny``, HF id, path) or a loaded model
        (then ``tokenizer`` is required); ``adapter``: with a name, a warm-start LoRA adapter directory merged
        into the weights as they load (``common/policy/warmstart.py``); ``kv_cache``: ``static`` (one
        preallocated cache per batch, written in place), ``dynamic`` (grows by concatenation; the same
        tokens) or ``auto``: static on a CPU, where it was measured faster (bench/bench_cpu_quickstart.py),
        dynamic on a GPU (a static cache would reserve every row's whole reply budget up front);
        ``continuous=False``: a batch runs to its last row and later requests wait for the next batch (the
        run-to-completion batching this replaced; bench/bench_cpu_quickstart.py compares); ``prefill_tokens``:
        the most (padded) prompt tokens one prefill forward takes, further rows that arrived together are
        prefilled in the next forwards and merged (bounds a prefill's activations, ~70 MB per 1K tokens for
        SmolLM2; default 4096 on a CPU, where RAM is the limit, no bound on a GPU); ``decode``: :data:`DECODE_MODES`
        (the module docstring). ``dtype`` defaults to bfloat16 (generation on CPU is fine in
        bf16 on AVX512-BF16 machines; pass ``float32`` for exact tests). ``max_context_tokens`` defaults
        to the model's ``max_position_embeddings``."""
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype is None:
            dtype = "bfloat16"
        if isinstance(model, str):
            self.model_name = model
            model, loaded_tok = load_model(model, dtype=dtype, device=device, seed=seed, adapter=adapter)
            tokenizer = tokenizer if tokenizer is not None else loaded_tok
        else:
            if tokenizer is None:
                raise ValueError("HFPolicy(model=<loaded model>) needs tokenizer=")
            if adapter is not None:
                raise ValueError("HFPolicy(model=<loaded model>) takes no adapter= (merge it before)")
            self.model_name = getattr(getattr(model, "config", None), "name_or_path", "model") or "model"
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.prefill_tokens = prefill_tokens or (4096 if self.device.type == "cpu" else None)
        super().__init__(max_batch_size, max_wait_ms)
        if not continuous:
            self.queue.run_continuous = None
        cfg_max = getattr(model.config, "max_position_embeddings", None) or 8192
        self.max_context_tokens = int(max_context_tokens or cfg_max)
        self.eos_ids = self._eos_ids()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self._generator = torch.Generator(device="cpu").manual_seed(seed)
        self._lock = threading.Lock()  # one forward pass at a time (sync callers + the worker thread)
        # transformers 5 renamed forward(past_key_values=...) to forward(cache=...)
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        if kv_cache not in ("auto", "static", "dynamic"):
            raise ValueError(f"kv_cache must be auto, static or dynamic, not {kv_cache!r}")
        on_cpu = self.device.type == "cpu"
        self.kv_cache = kv_cache if kv_cache != "auto" else ("static" if on_cpu else "dynamic")
        self.decode = decode_mode(decode, model, self.device)
        self._slots = SlotDecoder(model, graphs=self.decode == "graphs") if self.decode != "hf" else None
        self.failure: EngineOutOfMemory | None = None
        """Set once decoding ran out of GPU memory: every later call gets it (a tier stops the run with its
        line: ``common.run.trainer_memory.generation_oom``)."""
        self._rows_in_flight = 0  # rows decoding together now (the out-of-memory line says how many)

    # ------------------------------------------------------------------ generation
    def _eos_ids(self) -> list[int]:
        from common.policy.models import reply_end_ids

        return reply_end_ids(self.tokenizer, getattr(self.model.generation_config, "eos_token_id", None))

    def _run_batch(self, requests: list[GenerationRequest]) -> list[Completion | Exception]:
        feed = ListFeed(len(requests))
        self._run_continuous(requests, feed)
        return feed.results  # type: ignore[return-value]

    def _run_continuous(self, requests: list[GenerationRequest], feed: Any) -> None:
        if self.failure is not None:  # out of GPU memory before: every later call fails at once, the same way
            raise self.failure
        with self._lock, torch.inference_mode():
            try:
                self._decode(list(enumerate(requests)), feed)
            except torch.OutOfMemoryError:
                self.failure = self._out_of_memory()
                raise self.failure from None

    def _out_of_memory(self) -> EngineOutOfMemory:
        """The :class:`EngineOutOfMemory` of an out-of-memory error while decoding (what was held, then the
        slots and the allocator's cache freed); sticky: :attr:`failure`."""
        from common.memory import gpu_held_note

        note = gpu_held_note(self.device)
        if self._slots is not None:
            self._slots.release()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        rows = self._rows_in_flight
        return EngineOutOfMemory(
            f"CUDA out of memory while decoding {rows} model calls together{note}: fewer at once "
            f"(max_batch_size {self.max_batch_size}) or shorter prompts and replies",
            rows=rows,
            note=note,
        )

    def _new_cache(self, length: int) -> Any:
        """The KV cache of one batch (``kv_cache``; why static on a CPU: the module docstring)."""
        from transformers import DynamicCache, StaticCache

        if self.kv_cache == "dynamic" or self._slots is not None:  # slots: the prefill's columns only
            return DynamicCache()
        return StaticCache(config=self.model.config, max_cache_len=length)

    def _make_row(self, i: int, req: GenerationRequest) -> _Row:
        sp = req.sampling
        ids, truncated = prompt_for(self.tokenizer, req, self.max_context_tokens)
        gen = None
        if sp.seed is not None:
            gen = torch.Generator(device="cpu").manual_seed(int(sp.seed))
        return _Row(i, req, ids, truncated, gen)

    def _pick(self, rows: list[_Row], logits: torch.Tensor) -> tuple[list[int], list[float]]:
        """Next token and behaviour log-prob of every row, from the float32 logits ``(B, V)`` left on the
        model's device (one host transfer per step). Greedy rows: argmax. Sampled rows: inverse-CDF
        sampling from ``softmax(logits / T)`` (top-p filtered and renormalised), one uniform draw per token
        from the row's generator (torch.multinomial is far slower on a 49K vocab). The recorded log-prob
        is the raw ``log_softmax(logits)`` of the chosen token in every case (module docstring)."""
        dev = logits.device
        sps: list[SamplingParams] = [r.request.sampling for r in rows]
        greedy = [sp.temperature <= 0 for sp in sps]
        temps = torch.tensor([1.0 if g else float(sp.temperature) for sp, g in zip(sps, greedy, strict=True)])
        scaled = logits / temps.to(dev, logits.dtype).unsqueeze(-1)
        nucleus = [b for b, (sp, g) in enumerate(zip(sps, greedy, strict=True)) if not g and sp.top_p < 1.0]
        if nucleus:
            idx = torch.tensor(nucleus, device=dev)
            top_p = torch.tensor([float(sps[b].top_p) for b in nucleus], device=dev, dtype=logits.dtype)
            scaled[idx] = _top_p_filter(scaled[idx], top_p)
        tokens = torch.argmax(logits, dim=-1)  # [B]
        sampled = [b for b, g in enumerate(greedy) if not g]
        if sampled:
            gens = [rows[b].generator if rows[b].generator is not None else self._generator for b in sampled]
            u = torch.cat([torch.rand(1, generator=g) for g in gens]).to(dev, logits.dtype)
            idx = torch.tensor(sampled, device=dev)
            cdf = torch.cumsum(torch.softmax(scaled[idx], dim=-1), dim=-1)  # [S, V] sampler's CDF
            draw = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1)).squeeze(-1)
            tokens[idx] = draw.clamp(max=logits.shape[-1] - 1)
        raw = torch.log_softmax(logits, dim=-1)  # [B, V]: the trainer's distribution (T = 1, no top-p)
        chosen = raw.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # [B]
        # one device-to-host copy (the step's only sync): token ids and float32 log-probs are exact in float64
        both = torch.stack([tokens.to(torch.float64), chosen.to(torch.float64)]).tolist()
        return [int(t) for t in both[0]], both[1]

    def _check_done(self, row: _Row) -> bool:
        sp = row.request.sampling
        if row.output_ids[-1] in self.eos_ids and not sp.ignore_eos:
            row.finish_reason = "stop"
            return True
        if sp.stop:
            # Decode only a tail window (a stop string of L characters spans at most ~4L byte-level
            # tokens); decode everything once a stop string shows up in it.
            window = 4 * max(len(x) for x in sp.stop) + 8
            tail = self.tokenizer.decode(row.output_ids[-window:], skip_special_tokens=True)
            if find_stop(tail, sp.stop) >= 0:
                text = self.tokenizer.decode(row.output_ids, skip_special_tokens=True)
                end = find_stop(text, sp.stop)
                if end >= 0:
                    row.finish_reason, row.text = "stop", text[:end]
                    return True
        if len(row.output_ids) >= sp.max_new_tokens:
            row.finish_reason = "length"
            return True
        return False

    def _decode(self, incoming: list[tuple[int, GenerationRequest]], feed: Any) -> None:
        """Continuous batching: decode the running batch one token per step; between steps, requests that
        arrived (``feed.take``) are prefilled and merged into it, and a finished row's caller gets its result
        at once (``feed.finish``). Every row keeps its own positions, so its tokens do not depend on when it
        joined (up to the float rounding of batched kernels)."""
        batch: _Batch | None = None
        while True:
            if stop.requested():  # Ctrl-C / kill: every caller gets the stop at once, nothing decodes on
                rows = batch.rows if batch is not None else []
                for handle in [r.index for r in rows] + [i for i, _ in [*incoming, *feed.take(1 << 30)]]:
                    feed.finish(handle, feed.stopped("stopped: Ctrl-C or kill"))
                return
            if batch is not None and not batch.rows:  # every row left at the last step (its cache with them)
                batch = None
            for chunk in self._prefill_chunks(self._admissible(incoming, feed)):
                batch = self._admit(batch, chunk, feed)  # None or a batch with rows
                trim_memory_every(2.0)  # the merge freed two caches: their pages back to the OS (CPU RSS)
            if batch is None:
                incoming = feed.take(self.max_batch_size)
                if not incoming:
                    return
                continue
            self._rows_in_flight = len(batch.rows)
            self._step(batch, feed)
            room = self.max_batch_size - len(batch.rows)
            incoming = feed.take(room) if room > 0 else []

    def _admissible(self, incoming: list[tuple[int, GenerationRequest]], feed: Any) -> list[_Row]:
        """Rows for the requests that need decoding; a bad request gets its exception, a zero budget ``""``."""
        rows = []
        for handle, req in incoming:
            try:
                row = self._make_row(handle, req)
            except (ValueError, TypeError, KeyError) as exc:  # bad messages / impossible budget
                feed.finish(handle, exc)
                continue
            if req.sampling.max_new_tokens <= 0:
                row.text = ""
                feed.finish(handle, self._completion(row))
                continue
            rows.append(row)
        self.stats["requests"] += len(incoming)
        return rows

    def _prefill_chunks(self, rows: list[_Row]) -> list[list[_Row]]:
        """``rows`` in arrival order, cut so that each chunk's padded prompt (rows x longest) stays within
        ``prefill_tokens`` (a chunk has at least one row)."""
        chunks: list[list[_Row]] = []
        for r in rows:
            last = chunks[-1] if chunks else None
            width = max([len(x.prompt_ids) for x in last or []] + [len(r.prompt_ids)])
            if last and (self.prefill_tokens is None or (len(last) + 1) * width <= self.prefill_tokens):
                last.append(r)
            else:
                chunks.append([r])
        return chunks

    def _admit(self, batch: _Batch | None, rows: list[_Row], feed: Any) -> _Batch | None:
        """Prefill ``rows`` (left-padded, explicit positions), sample their first tokens, and merge the rows
        still going into ``batch`` (a new KV cache holding both, right-aligned; columns no row uses dropped)."""
        self._rows_in_flight = len(rows) + (len(batch.rows) if batch is not None else 0)
        width = max(len(r.prompt_ids) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, r in enumerate(rows):
            input_ids[b, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids, dtype=torch.long)
            mask[b, width - len(r.prompt_ids) :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = self._new_cache(width + max(self._left(r) for r in rows))
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
            cache_position=torch.arange(width, device=self.device),
            **{self._cache_kw: cache},
        )
        self.stats["batches"] += 1
        if self._slots is not None:  # the rows' keys and values into slots after the running batch's
            return self._admit_slots(batch, rows, cache, width, out.logits[:, -1, :].float(), feed)
        new = _Batch(rows, cache, mask, width)
        self._take_tokens(new, out.logits[:, -1, :].float(), feed)
        if not new.rows:
            return batch
        return new if batch is None else self._merge(batch, new)

    # ------------------------------------------------------------------ slot decoding (decode=slots|graphs)
    def _admit_slots(
        self, batch: _Batch | None, rows: list[_Row], cache: Any, width: int, logits: torch.Tensor, feed: Any
    ) -> _Batch | None:
        """Slot mode: the prefilled ``rows`` go into the slots after the running batch's (the cache grows
        when it must), then their first tokens are taken (``logits``: their prefill's last position)."""
        assert self._slots is not None
        old = batch.rows if batch is not None else []
        need = max(len(r.prompt_ids) + self._left(r) for r in rows)
        self._slots.ensure(len(old) + len(rows), need, keep=len(old))
        self._slots.load_rows(len(old), cache, width, [len(r.prompt_ids) for r in rows])
        del cache
        merged = _Batch(old + rows, None, None, 0)
        self._take_slot_tokens(merged, logits, feed, first=len(old))
        return merged if merged.rows else None

    def _step_slots(self, batch: _Batch, feed: Any) -> None:
        """Slot mode: every row's last token at its own position, one step (a graph replay with ``graphs``)."""
        assert self._slots is not None
        logits = self._slots.step(
            [r.output_ids[-1] for r in batch.rows],
            [len(r.prompt_ids) + len(r.output_ids) - 1 for r in batch.rows],
        )
        self._take_slot_tokens(batch, logits, feed, first=0)

    def _take_slot_tokens(self, batch: _Batch, logits: torch.Tensor, feed: Any, first: int) -> None:
        """:meth:`_take_tokens` for slots: rows ``first ..`` get their next token (``logits`` holds theirs);
        rows that end leave and the later ones move down a slot, in order."""
        assert self._slots is not None
        stepped = batch.rows[first:]
        next_tokens, chosen = self._pick(stepped, logits)
        keep = list(range(first))
        for b, r in enumerate(stepped):
            r.output_ids.append(next_tokens[b])
            r.logprobs.append(chosen[b])
            if self._check_done(r):
                feed.finish(r.index, self._completion(r))
            elif feed.wanted(r.index):
                keep.append(first + b)
        self.stats["generated_tokens"] += len(stepped)
        if len(keep) < len(batch.rows):
            self._slots.keep_rows(keep, len(batch.rows))
            batch.rows = [batch.rows[i] for i in keep]

    def release_cache(self) -> None:
        """Free what decoding holds between calls (slot mode's KV slots and CUDA graphs) so a training step
        can use the memory; the next call allocates (and captures) again. A no-op for ``decode=hf``."""
        if self._slots is None:
            return
        with self._lock:
            self._slots.release()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def _merge(self, a: _Batch, b: _Batch) -> _Batch:
        """One batch holding ``a``'s rows then ``b``'s: each one's KV and mask right-aligned in ``T`` columns
        (the longest span either uses), in a new cache with room for every row's remaining budget. Keys
        carry their rotary positions already, so moving them to other columns changes nothing."""
        lo_a, lo_b = _first_used(a.mask), _first_used(b.mask)
        T = max(a.width - lo_a, b.width - lo_b)
        na, rows = len(a.rows), a.rows + b.rows

        def aligned(
            xa: torch.Tensor, xb: torch.Tensor
        ) -> torch.Tensor:  # [Ba, ..., a.width] + [Bb, ..., b.width]
            out = xa.new_zeros((len(rows), *xa.shape[1:-1], T))
            out[:na, ..., T - (a.width - lo_a) :] = xa[..., lo_a:]
            out[na:, ..., T - (b.width - lo_b) :] = xb[..., lo_b:]
            return out

        cache = self._new_cache(T + max(self._left(r) for r in rows))
        for layer, (ka, va, kb, vb) in enumerate(_kv(a, b)):  # [B, H, width, D] -> seq last and back
            k = aligned(ka.transpose(2, 3), kb.transpose(2, 3)).transpose(2, 3)
            v = aligned(va.transpose(2, 3), vb.transpose(2, 3)).transpose(2, 3)
            cache.update(k.contiguous(), v.contiguous(), layer)
            del ka, va, kb, vb, k, v
            for old in (a.cache.layers[layer], b.cache.layers[layer]):  # a and b end here: free as we go,
                old.keys = old.values = None  # so the merge holds one cache and a layer, not two caches
        return _Batch(rows, cache, aligned(a.mask, b.mask), T)

    def _step(self, batch: _Batch, feed: Any) -> None:
        """Feed every row's last token at column ``batch.width``; sample the next ones."""
        if self._slots is not None:
            return self._step_slots(batch, feed)
        step_ids = torch.tensor(
            [[r.output_ids[-1]] for r in batch.rows], dtype=torch.long, device=self.device
        )
        pos = torch.tensor(
            [[len(r.prompt_ids) + len(r.output_ids) - 1] for r in batch.rows],
            dtype=torch.long,
            device=self.device,
        )
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.rows), 1))], dim=-1)
        out = self.model(
            input_ids=step_ids,
            attention_mask=batch.mask,
            position_ids=pos,
            use_cache=True,
            cache_position=torch.tensor([batch.width], device=self.device),
            **{self._cache_kw: batch.cache},
        )
        batch.width += 1
        self._take_tokens(batch, out.logits[:, -1, :].float(), feed)

    def _take_tokens(self, batch: _Batch, logits: torch.Tensor, feed: Any) -> None:
        """Append each row's next token; hand finished rows to their callers and drop them (and their KV)."""
        next_tokens, chosen = self._pick(batch.rows, logits)
        keep: list[int] = []
        for b, r in enumerate(batch.rows):
            r.output_ids.append(next_tokens[b])
            r.logprobs.append(chosen[b])
            if self._check_done(r):
                feed.finish(r.index, self._completion(r))
            elif feed.wanted(r.index):
                keep.append(b)
            # else: its caller stopped waiting (a deadline, a cancelled tree): the row and its KV go now
        self.stats["generated_tokens"] += len(batch.rows)
        if len(keep) < len(batch.rows):
            if keep:
                idx = torch.tensor(keep, dtype=torch.long, device=self.device)
                batch.cache.reorder_cache(idx)
                batch.mask = batch.mask[idx]
            batch.rows = [batch.rows[b] for b in keep]

    @staticmethod
    def _left(r: _Row) -> int:
        """Tokens ``r`` may still generate (+1: the cache column of the token fed last)."""
        return r.request.sampling.max_new_tokens - len(r.output_ids) + 1

    def _completion(self, r: _Row) -> Completion:
        text = r.text
        if text is None:
            text = self.tokenizer.decode(r.output_ids, skip_special_tokens=True)
        return Completion(
            text=text,
            prompt_ids=list(r.prompt_ids),
            output_ids=list(r.output_ids),
            logprobs=list(r.logprobs),
            finish_reason=r.finish_reason,
            prompt_truncated=r.truncated,
        )

    def _load_weights(self, pairs: list[tuple[str, Any]]) -> None:
        """Copy ``(name, tensor)`` pairs into the model's parameters and buffers (unknown names raise; a
        tied alias such as ``lm_head.weight`` is accepted: :func:`named_tensors`)."""
        own = named_tensors(self.model)
        unknown = [n for n, _ in pairs if n not in own]
        if unknown:
            raise KeyError(
                f"update_weights: the model has no tensors named {unknown[:3]} ({len(unknown)} unknown)"
            )
        with self._lock, torch.no_grad():
            for name, tensor in pairs:
                if own[name] is not tensor:
                    own[name].copy_(tensor)

    def score_logprobs(
        self, prompt_ids: list[int], output_ids: list[int], temperature: float = 1.0
    ) -> list[float]:
        """Teacher-forced log-probs of ``output_ids`` after ``prompt_ids`` (``log_softmax(logits / T)``)."""
        if not output_ids:
            return []
        ids = torch.tensor([list(prompt_ids) + list(output_ids)], dtype=torch.long, device=self.device)
        with self._lock, torch.inference_mode():  # logits only where an output token is predicted
            logits = self.model(input_ids=ids, logits_to_keep=len(output_ids) + 1).logits[0].float().cpu()
        t = temperature if temperature > 0 else 1.0
        logp = torch.log_softmax(logits[:-1] / t, dim=-1)  # [T, V]: position P-1+t predicts output token t
        target = torch.tensor(output_ids, dtype=torch.long).unsqueeze(-1)
        return logp.gather(-1, target).squeeze(-1).tolist()


def find_engine(policy: Any, kind: type = Engine) -> Any:
    """The ``kind`` engine under ``policy``'s wrappers (``CountingPolicy.inner``, ``TeacherForcedPolicy.model``),
    or None."""
    from common.policy.base import Policy

    seen: set[int] = set()
    while policy is not None and id(policy) not in seen:
        if isinstance(policy, kind):
            return policy
        seen.add(id(policy))
        policy = next(
            (getattr(policy, a) for a in ("inner", "model", "policy") if isinstance(getattr(policy, a, None), Policy)),
            None,
        )
    return None


def decode_metrics(policy: Any) -> dict[str, float]:
    """The hf engine's decoding so far, for a round's metrics (``{}`` for ``decode=hf``, or no hf engine):
    ``engine/graphs`` (1 while CUDA graphs decode), ``engine/graph_captures``, ``engine/graph_replays`` and
    ``engine/eager_steps`` (slot steps run without a graph), counted from the engine's start."""
    engine = find_engine(policy, HFPolicy)
    slots = getattr(engine, "_slots", None)
    if slots is None:
        return {}
    st = slots.stats
    return {
        "engine/graphs": float(slots.graphs),
        "engine/graph_captures": float(st["captures"]),
        "engine/graph_replays": float(st["replays"]),
        "engine/eager_steps": float(st["eager_steps"]),
    }


def release_engine_cache(policy: Any) -> None:
    """:meth:`HFPolicy.release_cache` of the hf engine under ``policy``, if there is one (between the rollouts and
    the training step: the slots' KV cache and CUDA graphs are memory the step can use)."""
    engine = find_engine(policy, HFPolicy)
    if engine is not None:
        engine.release_cache()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    prompt = " ".join(argv) or "Say hello in five words."
    policy = HFPolicy(DEFAULT_MODEL)
    req = GenerationRequest(
        messages=[{"role": "user", "content": prompt}], sampling=SamplingParams(64, temperature=0)
    )
    comp = policy.generate_batch([req])[0]
    print(comp.text)
    print(
        f"[{len(comp.prompt_ids)} prompt tokens, {len(comp.output_ids)} output tokens, "
        f"finish={comp.finish_reason}, mean logprob={sum(comp.logprobs) / max(1, len(comp.logprobs)):.3f}]"
    )
    return 0 if math.isfinite(sum(comp.logprobs)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
