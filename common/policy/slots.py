"""The hf engine's decode step without per-step Python on a GPU: a KV cache of one *slot* per row, and the
step captured once per batch size as a CUDA graph.

Why (issue #54): on one H100 the quick start decoded at 83 tokens/s with the GPU 4-8 % busy and one CPU
core at 100 %. A SmolLM2 decode step is ~0.1 ms of GPU work, but transformers' eager forward issues ~7,000
Python calls per step (``python bench/bench_laptop_gpu.py --part overhead`` measures it on a CPU: 10-19 ms
per step for a 30-layer model whose compute is nil), so the GPU waited on the host. A CUDA graph replays the
whole step's kernels with one launch.

A graph needs fixed shapes and addresses, which transformers' caches do not give (a ``DynamicCache`` grows
every step; the hf engine's batches change width when rows join). Here:

* the cache is two tensors ``[layers, slots, kv_heads, length, head_dim]`` (keys, values), allocated once and
  grown only when a row needs more slots or columns than they hold; row ``i`` of the running batch lives in
  slot ``i``, its token at position ``p`` in column ``p`` (no padding: every row has its own length);
* one decode step feeds every row's last token at its own position: the decoder layers are the model's own
  modules (its norms, projections, rotary embedding and attention function, LoRA layers included), called
  with a cache object whose ``update`` writes each row's new key and value at that row's column and returns
  the slots' whole keys and values, and with a mask ``column <= position`` per row;
* the step runs over a *bucket* of rows (1, 2, 4, 8, ... up to the slots): rows beyond the batch are idle
  slots whose writes land in their own column 0, overwritten when a row moves in; with ``graphs`` (CUDA
  only) each bucket's step is captured once and replayed, its inputs copied into fixed buffers;
* a new row is prefilled by the model's ordinary forward (transformers' cache) and its keys and values copied
  into its slot; a finished row leaves and the rows after it move down one slot (the batch keeps its order).

The model's weights are read where they live, so an optimizer step that updates them in place (every tier
does) is seen by the next replay; ``release()`` frees the cache and the graphs (the trainer's step needs the
memory on a small card). What it covers: Llama-family models (``model_type == "llama"``: SmolLM2 and the test
models); others decode the ordinary way (``slot_decode_unsupported``).

Exactness: on a CPU in float32 the slot step gives the tokens of the ordinary path (the attention sums run over
the slot's whole length with masked columns instead of the batch's width, so log-probs agree to float
rounding: tests/test_policy_hf.py); a graph replays the same kernels as the eager slot step, bit for bit
(tests/test_cuda_parity.py, CUDA only).
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch

SLOT_MODEL_TYPES = ("llama",)
"""Model types whose decoder layers the slot step drives (``LlamaModel``'s layer loop)."""

LENGTH_STEP = 256
"""The cache's length grows in multiples of this many columns (fewer re-allocations and re-captures)."""


def decode_model(model: Any) -> Any:
    """The ``*ForCausalLM`` module under a peft (LoRA) wrapper, or ``model`` itself."""
    return model.get_base_model() if hasattr(model, "peft_config") and hasattr(model, "get_base_model") else model


def slot_decode_unsupported(model: Any) -> str | None:
    """Why the slot step cannot drive ``model`` (None when it can)."""
    base = decode_model(model)
    cfg = getattr(base, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in SLOT_MODEL_TYPES:
        return f"model type {kind!r} (the slot decoder drives {', '.join(SLOT_MODEL_TYPES)})"
    inner = getattr(base, "model", None)
    for part in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(inner, part):
            return f"the model has no model.{part}"
    if not hasattr(base, "lm_head"):
        return "the model has no lm_head"
    attn = getattr(cfg, "_attn_implementation", None) or "sdpa"
    if attn not in ("sdpa", "eager"):
        return f"attention implementation {attn!r} (sdpa and eager take the slot mask)"
    return None


def bucket(n: int) -> int:
    """The smallest power of two >= ``n`` (the batch sizes a graph is captured for)."""
    return 1 << max(0, n - 1).bit_length()


class _SlotView:
    """What the decoder layers see as their cache during one slot step: ``update`` writes each row's new key
    and value (``[B, kv_heads, 1, head_dim]``) at that row's column and returns the slots' keys and values
    ``[B, kv_heads, length, head_dim]``. The signature takes what every transformers version passes."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor):
        self.keys, self.values, self.rows, self.pos = keys, values, rows, pos

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        b = key_states.shape[0]
        k, v = self.keys[layer_idx], self.values[layer_idx]  # [S, kv_heads, T, D]
        k[self.rows, :, self.pos] = key_states[:, :, 0]
        v[self.rows, :, self.pos] = value_states[:, :, 0]
        return k[:b], v[:b]


class SlotDecoder:
    """The slot cache and step of one model (see the module docstring). Not thread-safe: the engine calls it
    under its lock."""

    def __init__(self, model: Any, graphs: bool = False) -> None:
        why = slot_decode_unsupported(model)
        if why is not None:
            raise ValueError(f"the slot decoder cannot drive this model: {why}")
        self.base = decode_model(model)
        self.inner = self.base.model
        self.graphs = bool(graphs)
        cfg = self.base.config
        self.n_layers = int(cfg.num_hidden_layers)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        params = inspect.signature(self.inner.layers[0].forward).parameters
        names = ("cache", "past_key_values", "past_key_value")  # transformers 5.2x, 4.56-5.1x, older
        self._cache_kw = next((n for n in names if n in params), "past_key_values")
        self._additive_mask = (getattr(cfg, "_attn_implementation", None) or "sdpa") == "eager"
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self._graphs: dict[int, tuple[Any, torch.Tensor]] = {}
        self._inputs: torch.Tensor | None = None  # [2, S] long: tokens, positions (the graphs' inputs)
        self.stats = {"captures": 0, "replays": 0, "eager_steps": 0, "grows": 0}

    # ---- storage -----------------------------------------------------------------------------------------
    @property
    def slots(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[1])

    @property
    def length(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[3])

    def bytes_for(self, slots: int, length: int) -> int:
        """Bytes of a cache of ``slots`` x ``length`` (keys and values)."""
        p = next(self.base.parameters())
        return 2 * self.n_layers * slots * self.kv_heads * length * self.head_dim * p.element_size()

    def ensure(self, rows: int, length: int, keep: int) -> None:
        """Room for ``rows`` rows of up to ``length`` columns; the first ``keep`` slots' contents are kept
        when the cache grows (slots double, the length grows by half at least, in steps of :data:`LENGTH_STEP`)."""
        if self.keys is not None and rows <= self.slots and length <= self.length:
            return
        slots = max(bucket(rows), self.slots)
        cols = self.length
        if length > cols:  # at least half again as long: a round's prompts grow turn by turn, and every
            cols = max(length, cols + cols // 2)  # growth re-captures the graphs
        cols = -(-cols // LENGTH_STEP) * LENGTH_STEP
        p = next(self.base.parameters())
        shape = (self.n_layers, slots, self.kv_heads, cols, self.head_dim)
        old_k, old_v = self.keys, self.values
        self.drop_graphs()
        self.keys = self.values = None  # our references go: the old cache lives on only in old_k, old_v
        keys = torch.zeros(shape, dtype=p.dtype, device=p.device)
        values = torch.zeros(shape, dtype=p.dtype, device=p.device)
        if old_k is not None and keep:
            t = old_k.shape[3]
            keys[:, :keep, :, :t] = old_k[:, :keep]
            values[:, :keep, :, :t] = old_v[:, :keep]
        del old_k, old_v
        self.keys, self.values = keys, values
        self._inputs = torch.zeros((2, slots), dtype=torch.long, device=p.device)
        self.stats["grows"] += 1

    def release(self) -> None:
        """Free the cache and the captured graphs (the next step allocates and captures again)."""
        self.drop_graphs()
        self.keys = self.values = self._inputs = None

    def drop_graphs(self) -> None:
        self._graphs.clear()

    def load_rows(self, first: int, cache: Any, width: int, lengths: list[int]) -> None:
        """Copy the keys and values of a prefill (transformers ``cache``, rows left-padded to ``width``: row
        ``b``'s ``lengths[b]`` tokens end at column ``width``) into slots ``first``, ``first + 1``, ..."""
        assert self.keys is not None and self.values is not None
        for layer, lay in enumerate(cache.layers):
            for b, n in enumerate(lengths):
                self.keys[layer, first + b, :, :n] = lay.keys[b, :, width - n : width]
                self.values[layer, first + b, :, :n] = lay.values[b, :, width - n : width]

    def keep_rows(self, keep: list[int], n: int) -> None:
        """The rows ``keep`` (indices into the ``n`` slots in use, ascending) move down to slots
        ``0 .. len(keep) - 1``, in order; the rest leave."""
        assert self.keys is not None and self.values is not None
        if keep == list(range(len(keep))):
            return  # only rows at the end left: nothing moves
        idx = torch.tensor(keep, dtype=torch.long, device=self.keys.device)
        m = len(keep)
        self.keys[:, :m] = self.keys[:, idx]  # advanced indexing copies first: no overlap hazard
        self.values[:, :m] = self.values[:, idx]

    # ---- the step ----------------------------------------------------------------------------------------
    def _forward(self, b: int) -> torch.Tensor:
        """One decode step of slots ``0 .. b - 1`` from ``self._inputs`` (tokens, positions): logits
        ``[b, vocab]`` in float32. Only tensor operations on fixed shapes: what a graph captures."""
        assert self._inputs is not None and self.keys is not None and self.values is not None
        tokens, pos = self._inputs[0, :b], self._inputs[1, :b]
        rows = torch.arange(b, device=tokens.device)
        hidden = self.inner.embed_tokens(tokens[:, None])  # [b, 1, H]
        position_ids = pos[:, None]  # [b, 1]
        cos_sin = self.inner.rotary_emb(hidden, position_ids)
        cols = torch.arange(self.length, device=tokens.device)
        mask = (cols[None, :] <= pos[:, None])[:, None, None, :]  # [b, 1, 1, T]: each row's own columns
        if self._additive_mask:  # eager attention adds its mask to the scores: 0 where seen, the lowest float not
            low = torch.finfo(hidden.dtype).min
            mask = torch.zeros(mask.shape, dtype=hidden.dtype, device=mask.device).masked_fill(~mask, low)
        view = _SlotView(self.keys, self.values, rows, pos)
        for layer in self.inner.layers[: self.n_layers]:
            hidden = layer(
                hidden,
                attention_mask=mask,
                position_ids=position_ids,
                position_embeddings=cos_sin,
                use_cache=True,
                **{self._cache_kw: view},
            )
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden  # older transformers return tuples
        hidden = self.inner.norm(hidden)
        return self.base.lm_head(hidden[:, -1, :]).float()  # [b, V]

    def step(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """Logits ``[n, vocab]`` (float32, on the model's device) of the next token of rows ``0 .. n - 1``,
        fed ``tokens`` at ``positions``; each row's key and value are written at its position."""
        assert self._inputs is not None
        n = len(tokens)
        b = min(bucket(n), self.slots)
        host = torch.zeros((2, b), dtype=torch.long)
        host[0, :n] = torch.tensor(tokens, dtype=torch.long)
        host[1, :n] = torch.tensor(positions, dtype=torch.long)
        self._inputs[:, :b].copy_(host)  # one host-to-device copy; idle slots: token 0 at column 0
        if not self.graphs:
            self.stats["eager_steps"] += 1
            return self._forward(b)[:n]
        graph = self._graphs.get(b)
        if graph is None:
            try:
                graph = self._graphs[b] = self._capture(b)
            except torch.OutOfMemoryError:
                raise
            except Exception as e:  # noqa: BLE001 - an op that cannot be captured: decode eagerly, say so once
                self.graphs = False
                self.drop_graphs()
                why = (str(e).strip().splitlines() or [""])[0][:200]
                print(f"[decode] CUDA graph capture failed ({type(e).__name__}: {why}); decoding eagerly",
                      file=sys.stderr, flush=True)  # fmt: skip
                self.stats["eager_steps"] += 1
                return self._forward(b)[:n]
        graph[0].replay()
        self.stats["replays"] += 1
        return graph[1][:n]

    def _capture(self, b: int) -> tuple[Any, torch.Tensor]:
        """Capture bucket ``b``'s step (after two warm-up runs on a side stream, as torch asks). The warm-up
        runs do this step's writes already; the replay that follows writes the same values again."""
        assert self._inputs is not None
        if self._inputs.device.type != "cuda":  # a graph captures only CUDA work: it would replay as a no-op
            raise RuntimeError(f"the model is on {self._inputs.device}, not on a CUDA device")
        current = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward(b)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = self._forward(b)
        self.stats["captures"] += 1
        return graph, out
