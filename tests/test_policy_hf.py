"""HFPolicy: batched generation, left padding, log-probs, stop strings, the async batching queue.

Exactness tests use the seeded random ``tiny`` model in float32; one slow test loads the real SmolLM2.
Run: ``pytest tests/test_policy_hf.py`` (``-m "not slow"`` skips the SmolLM2 test).
"""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from common.policy.base import GenerationRequest, SamplingParams
from common.policy.hf import HFPolicy, find_stop

PROMPTS = [
    "hi",
    "Tell me a long story about dragons and castles, with many twists. " * 3,
    "What is 2+2?",
    "x",
    "Write python code that prints the first ten primes.",
    "a b c d e f g",
    "The quick brown fox jumps over the lazy dog.",
    "zzz " * 30,
]


@pytest.fixture(scope="module")
def tiny() -> HFPolicy:
    return HFPolicy("tiny", dtype="float32", device="cpu", max_batch_size=8, max_wait_ms=20)


def _req(content: str, n: int = 12, **kw) -> GenerationRequest:
    return GenerationRequest(
        messages=[{"role": "user", "content": content}], sampling=SamplingParams(max_new_tokens=n, **kw)
    )


def test_batch_of_8_equals_batch_of_1_greedy(tiny):
    reqs = [_req(p, temperature=0.0) for p in PROMPTS]
    batch = tiny.generate_batch(reqs)
    lengths = {len(c.prompt_ids) for c in batch}
    assert len(lengths) > 3  # really different prompt lengths -> real left padding
    for req, b in zip(reqs, batch, strict=True):
        single = tiny.generate_batch([req])[0]
        assert single.prompt_ids == b.prompt_ids
        assert single.output_ids == b.output_ids
        assert len(b.output_ids) == len(b.logprobs) == 12
        assert max(abs(x - y) for x, y in zip(single.logprobs, b.logprobs, strict=True)) < 1e-4
        assert b.finish_reason == "length"
    assert len({tuple(c.output_ids) for c in batch}) > 1  # the tiny model is not degenerate


def test_static_cache_generates_what_the_dynamic_cache_does(tiny):
    """The default StaticCache (allocated once, written in place) against transformers' DynamicCache on a
    mixed batch: different prompt lengths (left padding), reply budgets (rows finish and leave the cache at
    different steps), greedy and seeded sampling."""
    dynamic = HFPolicy(tiny.model, tiny.tokenizer, max_batch_size=8, kv_cache="dynamic")
    assert tiny.kv_cache == "static"  # auto on a CPU
    reqs = [_req(p, n=4 + 3 * i, temperature=0.0 if i % 2 else 1.0, seed=i) for i, p in enumerate(PROMPTS)]
    a, b = tiny.generate_batch(reqs), dynamic.generate_batch(reqs)
    assert len({len(c.output_ids) for c in a}) > 3  # rows really left the batch at different steps
    for x, y in zip(a, b, strict=True):
        assert x.output_ids == y.output_ids and x.finish_reason == y.finish_reason
        assert max(abs(u - v) for u, v in zip(x.logprobs, y.logprobs, strict=True)) < 1e-4
    with pytest.raises(ValueError, match="auto, static or dynamic"):
        HFPolicy(tiny.model, tiny.tokenizer, kv_cache="paged")


def test_slot_decoding_generates_what_the_hf_path_does(tiny):
    """``decode="slots"`` (one KV slot per row, the model's decoder layers driven with a per-row column mask:
    what a CUDA graph replays on a GPU, common/policy/slots.py) against the ordinary path on a mixed batch:
    different prompt lengths, reply budgets (rows leave and the later ones move down a slot), greedy and
    seeded sampling, a stop string. The same tokens; log-probs to float rounding."""
    slots = HFPolicy(tiny.model, tiny.tokenizer, max_batch_size=8, decode="slots")
    assert tiny.decode == "hf" and slots.decode == "slots"  # auto on a CPU: the ordinary path
    reqs = [_req(p, n=4 + 3 * i, temperature=0.0 if i % 2 else 1.0, seed=i) for i, p in enumerate(PROMPTS)]
    reqs[5] = _req(PROMPTS[5], n=30, temperature=0.0, stop=("e",))
    a, b = tiny.generate_batch(reqs), slots.generate_batch(reqs)
    assert len({len(c.output_ids) for c in a}) > 3
    for x, y in zip(a, b, strict=True):
        assert x.output_ids == y.output_ids and x.finish_reason == y.finish_reason and x.text == y.text
        assert max(abs(u - v) for u, v in zip(x.logprobs, y.logprobs, strict=True)) < 1e-4
    st = slots._slots.stats
    assert st["eager_steps"] > 0 and st["captures"] == st["replays"] == 0  # no graphs off CUDA


def test_slot_decoding_with_eager_attention(tiny):
    """A model on transformers' eager attention (it adds its mask to the scores) gets an additive slot mask."""
    from common.policy.models import build_tiny_model

    model, _ = build_tiny_model(0, tokenizer=tiny.tokenizer)
    model.config._attn_implementation = "eager"
    reqs = [_req(p, n=5 + i, temperature=0.0 if i % 2 else 1.0, seed=i) for i, p in enumerate(PROMPTS[:5])]
    plain = HFPolicy(model, tiny.tokenizer, max_batch_size=8, decode="hf").generate_batch(reqs)
    slots = HFPolicy(model, tiny.tokenizer, max_batch_size=8, decode="slots")
    assert slots._slots._additive_mask
    for x, y in zip(plain, slots.generate_batch(reqs), strict=True):
        assert x.output_ids == y.output_ids
        assert max(abs(u - v) for u, v in zip(x.logprobs, y.logprobs, strict=True)) < 1e-4


def test_slots_grow_keep_their_rows_and_are_released(tiny):
    """The slot cache starts at what the first rows need and grows (more slots, more columns) when rows with
    longer prompts or budgets join a running batch; the rows already decoding keep their keys and values
    through the growth. ``release_cache`` frees it (the trainer's step gets the memory) and the next call
    allocates again; :func:`release_engine_cache` finds the engine under a policy's wrappers."""
    from common.policy.hf import release_engine_cache
    from common.run.progress import CountingPolicy, LiveStats

    policy = HFPolicy(tiny.model, tiny.tokenizer, max_batch_size=8, max_wait_ms=0, decode="slots")
    long = _req(PROMPTS[3], n=300, temperature=0.0, ignore_eos=True)  # a short prompt, a long reply
    joiners = [_req(PROMPTS[1], n=6, temperature=0.0), _req(PROMPTS[7], n=9, temperature=1.0, seed=2),
               _req(PROMPTS[4], n=5, temperature=0.0)]  # fmt: skip

    async def run():
        first = asyncio.ensure_future(policy.generate(long))
        while policy.stats["generated_tokens"] < 3:
            await asyncio.sleep(0.001)
        shape = tuple(policy._slots.keys.shape)
        rest = await asyncio.gather(*(policy.generate(r) for r in joiners))
        return [await first, *rest], shape

    comps, shape = asyncio.run(run())
    assert shape[1] == 1  # one slot for the first row alone
    assert policy._slots.slots >= 4 and policy._slots.stats["grows"] >= 2
    for req, comp in zip([long, *joiners], comps, strict=True):
        alone = tiny.generate_batch([req])[0]
        assert comp.output_ids == alone.output_ids
        assert max(abs(x - y) for x, y in zip(comp.logprobs, alone.logprobs, strict=True)) < 1e-4
    release_engine_cache(CountingPolicy(policy, LiveStats()))
    assert policy._slots.keys is None
    again = policy.generate_batch(joiners[:1])[0]
    assert again.output_ids == comps[1].output_ids and policy._slots.keys is not None


def test_a_step_that_cannot_be_captured_decodes_eagerly_and_says_so(tiny, capsys):
    """A graph capture that fails (here: a model on the CPU, also on a GPU machine, where capturing it would
    record an empty graph; on a GPU an op a graph cannot hold) leaves the engine
    decoding eagerly, with one ``[decode]`` line on stderr, and the same tokens."""
    policy = HFPolicy(tiny.model, tiny.tokenizer, max_batch_size=8, decode="slots")
    policy._slots.graphs = True  # as decode="graphs" would on a GPU
    reqs = [_req(p, n=6, temperature=0.0) for p in PROMPTS[:3]]
    got = policy.generate_batch(reqs)
    assert [c.output_ids for c in got] == [c.output_ids for c in tiny.generate_batch(reqs)]
    err = capsys.readouterr().err
    assert err.count("[decode] CUDA graph capture failed") == 1 and "decoding eagerly" in err
    assert policy._slots.graphs is False and policy._slots.stats["captures"] == 0


def test_decode_modes_are_chosen_and_refused_in_one_line(tiny, monkeypatch):
    """``auto``: the ordinary path on a CPU; ``graphs`` needs CUDA; the slot decoder drives Llama-family models
    only; ``SERA_HF_DECODE`` overrides the argument. A LoRA-wrapped model decodes through its adapter."""
    import torch

    from common.policy.hf import decode_mode
    from common.policy.lora import add_lora

    cpu = torch.device("cpu")
    assert decode_mode("auto", tiny.model, cpu) == "hf"
    with pytest.raises(ValueError, match="graphs needs CUDA"):
        HFPolicy(tiny.model, tiny.tokenizer, decode="graphs")
    with pytest.raises(ValueError, match="decode mode must be one of"):
        decode_mode("fast", tiny.model, cpu)
    monkeypatch.setattr(tiny.model.config, "model_type", "gpt2")
    with pytest.raises(ValueError, match="model type 'gpt2'"):
        decode_mode("slots", tiny.model, cpu)
    assert decode_mode("auto", tiny.model, torch.device("cuda")) == "hf"  # not driven: the ordinary path
    monkeypatch.undo()
    assert decode_mode("auto", tiny.model, torch.device("cuda")) == "graphs"
    monkeypatch.setenv("SERA_HF_DECODE", "slots")
    assert HFPolicy(tiny.model, tiny.tokenizer).decode == "slots"
    monkeypatch.delenv("SERA_HF_DECODE")
    import copy

    lora = add_lora(copy.deepcopy(tiny.model), rank=4, alpha=8.0, seed=0)
    with torch.no_grad():  # a nonzero adapter, so decoding through it matters
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.05)
    reqs = [_req(p, n=8, temperature=0.0) for p in PROMPTS[:4]]
    plain = HFPolicy(lora, tiny.tokenizer, decode="hf").generate_batch(reqs)
    slotted = HFPolicy(lora, tiny.tokenizer, decode="slots").generate_batch(reqs)
    assert [c.output_ids for c in plain] == [c.output_ids for c in slotted]
    assert [c.output_ids for c in plain] != [c.output_ids for c in tiny.generate_batch(reqs)]


def test_a_bounded_prefill_generates_what_one_prefill_does(tiny):
    """``prefill_tokens`` (4096 on a CPU: a prefill's activations are ~70 MB per 1K SmolLM2 tokens) cuts
    requests that arrive together into several prefill forwards merged into one batch; the same tokens."""
    chunked = HFPolicy(tiny.model, tiny.tokenizer, max_batch_size=8, max_wait_ms=20, prefill_tokens=64)
    assert tiny.prefill_tokens == 4096  # the CPU default
    rows = [r for r in (chunked._make_row(i, _req(p)) for i, p in enumerate(PROMPTS))]
    chunks = chunked._prefill_chunks(rows)
    assert len(chunks) > 2 and [r for c in chunks for r in c] == rows  # every row once, in order
    assert all(len(c) == 1 or len(c) * max(len(r.prompt_ids) for r in c) <= 64 for c in chunks)
    reqs = [_req(p, n=4 + 3 * i, temperature=0.0 if i % 2 else 1.0, seed=i) for i, p in enumerate(PROMPTS)]
    before = tiny.stats["batches"], chunked.stats["batches"]
    a, b = tiny.generate_batch(reqs), chunked.generate_batch(reqs)
    forwards = tiny.stats["batches"] - before[0], chunked.stats["batches"] - before[1]
    assert forwards[1] > forwards[0]  # the bounded one really prefilled in more forwards
    for x, y in zip(a, b, strict=True):
        assert x.output_ids == y.output_ids and x.finish_reason == y.finish_reason
        assert max(abs(u - v) for u, v in zip(x.logprobs, y.logprobs, strict=True)) < 1e-4


def test_greedy_logprobs_equal_teacher_forced(tiny):
    for comp in tiny.generate_batch([_req(p, n=16, temperature=0.0) for p in PROMPTS[:4]]):
        forced = tiny.score_logprobs(comp.prompt_ids, comp.output_ids)
        assert max(abs(x - y) for x, y in zip(comp.logprobs, forced, strict=True)) < 1e-4
        assert all(lp <= 0 and math.isfinite(lp) for lp in comp.logprobs)


def test_sampled_logprobs_are_the_trainers_untempered_distribution(tiny):
    """Sampled at T = 0.7, recorded at T = 1 (what the trainer scores): CISPO's ratio is 1 on-policy."""
    reqs = [_req(p, n=16, temperature=0.7, seed=i) for i, p in enumerate(PROMPTS[:4])]
    comps = tiny.generate_batch(reqs)
    for comp in comps:
        forced = tiny.score_logprobs(comp.prompt_ids, comp.output_ids)
        assert max(abs(x - y) for x, y in zip(comp.logprobs, forced, strict=True)) < 1e-4
        tempered = tiny.score_logprobs(comp.prompt_ids, comp.output_ids, temperature=0.7)
        assert max(abs(x - y) for x, y in zip(comp.logprobs, tempered, strict=True)) > 1e-2
    again = tiny.generate_batch(reqs)  # per-request seeds make sampling reproducible
    assert [c.output_ids for c in again] == [c.output_ids for c in comps]
    alone = tiny.generate_batch(reqs[2:3])[0]  # ... whatever batch the request lands in
    assert alone.output_ids == comps[2].output_ids


def test_top_p_samples_from_nucleus_records_raw_logprob(tiny):
    comps = tiny.generate_batch([_req(PROMPTS[2], n=12, temperature=1.0, top_p=0.5, seed=3)])
    forced = tiny.score_logprobs(comps[0].prompt_ids, comps[0].output_ids)
    # recorded: the untruncated log-prob (the trainer's), not the nucleus-renormalised one
    assert max(abs(a - b) for a, b in zip(comps[0].logprobs, forced, strict=True)) < 1e-4


def test_update_weights_changes_logprobs_and_version():
    """An engine fed a state dict by name: its log-probs are those of the new weights afterwards."""
    import torch

    a = HFPolicy("tiny", dtype="float32", device="cpu", seed=0)
    b = HFPolicy("tiny", dtype="float32", device="cpu", seed=1)  # other random weights
    req = _req(PROMPTS[4], n=10, temperature=0.0)
    comp = a.generate_batch([req])[0]
    before = a.score_logprobs(comp.prompt_ids, comp.output_ids)
    target = b.score_logprobs(comp.prompt_ids, comp.output_ids)
    assert max(abs(x - y) for x, y in zip(before, target, strict=True)) > 1e-2
    seconds = a.update_weights(b.model.state_dict(), version=3)
    assert a.version == 3 and seconds >= 0
    after = a.score_logprobs(comp.prompt_ids, comp.output_ids)
    assert max(abs(x - y) for x, y in zip(after, target, strict=True)) < 1e-5
    assert a.generate_batch([req])[0].output_ids == b.generate_batch([req])[0].output_ids
    a.update_weights(None)  # shared model: only the version moves
    assert a.version == 4
    with pytest.raises(KeyError, match="no tensors named"):
        a.update_weights({"not.a.weight": torch.zeros(1)})


def test_stop_string_cuts_generation_per_sequence(tiny):
    reqs = [_req(p, n=24, temperature=0.0) for p in PROMPTS[:3]]
    free = tiny.generate_batch(reqs)
    pieces = [tiny.tokenizer.decode([t]).strip() for t in free[1].output_ids[8:]]
    stop = next(p[:3] for p in pieces if p)  # a stop string from the middle of the free output
    reqs[1] = _req(PROMPTS[1], n=24, temperature=0.0, stop=("NEVER-APPEARS", stop))
    cut = tiny.generate_batch(reqs)
    assert cut[1].finish_reason == "stop"
    assert cut[1].text.endswith(stop) and find_stop(cut[1].text, (stop,)) == len(cut[1].text)
    assert len(cut[1].output_ids) < 24
    assert cut[1].output_ids == free[1].output_ids[: len(cut[1].output_ids)]  # up to and incl. the stop
    assert stop in tiny.tokenizer.decode(cut[1].output_ids)
    assert stop not in tiny.tokenizer.decode(cut[1].output_ids[:-1])
    assert cut[0].output_ids == free[0].output_ids and cut[2].output_ids == free[2].output_ids


def test_eos_stops_and_is_recorded(tiny):
    # Make EOS the greedy choice by biasing the head: output is exactly [EOS] with finish "stop".
    import torch

    eos = tiny.eos_ids[0]
    head = tiny.model.lm_head.weight
    saved = head[eos].clone()
    try:
        with torch.no_grad():
            head[eos] = head.abs().max() * 50 * torch.sign(tiny.model.model.norm.weight)
        comp = tiny.generate_batch([_req("hi", n=8, temperature=0.0)])[0]
    finally:
        with torch.no_grad():
            head[eos] = saved
    assert comp.output_ids == [eos] and comp.finish_reason == "stop" and comp.text == ""


def test_async_requests_are_batched(tiny):
    async def run():
        before = dict(tiny.stats)
        comps = await asyncio.gather(*(tiny.generate(_req(p, n=6, temperature=0.0)) for p in PROMPTS))
        return comps, tiny.stats["batches"] - before["batches"]

    comps, batches = asyncio.run(run())
    assert batches == 1
    direct = tiny.generate_batch([_req(p, n=6, temperature=0.0) for p in PROMPTS])
    assert [c.output_ids for c in comps] == [c.output_ids for c in direct]


@pytest.mark.parametrize(
    "kv_cache, continuous, decode",
    [("static", True, "hf"), ("dynamic", True, "hf"), ("static", False, "hf"), ("dynamic", True, "slots")],
)
def test_requests_join_a_running_batch_and_leave_when_done(tiny, kv_cache, continuous, decode):
    """Continuous batching: a request that arrives while a long batch decodes joins it (no new batch after
    the long row), its caller gets the result as soon as its own row is done (before the long row), and
    every row's tokens are those it gets alone, whether it joined with a longer or shorter prompt.
    ``continuous=False`` (run-to-completion batches): the joiners wait for the long row."""
    policy = HFPolicy(
        tiny.model, tiny.tokenizer, max_batch_size=8, max_wait_ms=0, kv_cache=kv_cache, continuous=continuous,
        decode=decode,
    )  # fmt: skip
    long = _req(PROMPTS[3], n=600, temperature=0.0, ignore_eos=True)  # short prompt: joiners have longer ones
    joiners = [_req(PROMPTS[1], n=5, temperature=0.0), _req(PROMPTS[2], n=7, temperature=1.0, seed=4)]
    late = _req(PROMPTS[0], n=6, temperature=1.0, seed=9)  # shorter prompt than the running rows' span

    async def run():
        done: list[str] = []

        async def call(name, req, after):
            await after()
            comp = await policy.generate(req)
            done.append(name)
            return comp

        async def decoding():  # the long row's batch has started decoding
            while policy.stats["generated_tokens"] < start + 3:
                await asyncio.sleep(0.001)

        async def first_joiner_done():
            while "j0" not in done:
                await asyncio.sleep(0.001)

        async def now():
            pass

        start, before = policy.stats["generated_tokens"], policy.stats["batches"]
        comps = await asyncio.gather(
            call("long", long, now), call("j0", joiners[0], decoding), call("j1", joiners[1], decoding),
            call("late", late, first_joiner_done),
        )  # fmt: skip
        return comps, done, policy.stats["batches"] - before

    comps, done, prefills = asyncio.run(run())
    if continuous:
        assert done[-1] == "long" and set(done[:-1]) == {"j0", "j1", "late"}  # delivered while "long" went on
        assert prefills >= 3  # long, the joiners, late: each prefilled into the running batch, not after it
    else:
        assert done[0] == "long"  # everyone else waited for the long row's batch to end
    for req, comp in zip([long, *joiners, late], comps, strict=True):
        alone = policy.generate_batch([req])[0]
        assert comp.prompt_ids == alone.prompt_ids and comp.output_ids == alone.output_ids
        assert max(abs(x - y) for x, y in zip(comp.logprobs, alone.logprobs, strict=True)) < 1e-4
    assert len(comps[0].output_ids) == 600


def test_a_request_arriving_as_the_last_row_leaves_starts_a_fresh_batch(tiny):
    """The running batch empties at a step and, in the same moment, a request arrives: it gets a batch of
    its own (it used to be merged into the emptied batch's stale cache, and every caller failed)."""
    from common.policy.engine import ListFeed

    class Feed(ListFeed):  # hands over one request at the first ``take``: when the first rows have left
        def __init__(self, later):
            super().__init__(3)
            self.later = [(2, later)]

        def take(self, n):
            got, self.later = self.later, []
            return got

    first = [_req(p, n=2, temperature=0.0, ignore_eos=True) for p in PROMPTS[1:3]]  # both leave at step 2
    later = _req(PROMPTS[4], n=5, temperature=0.0)
    policy = HFPolicy(tiny.model, tiny.tokenizer, max_batch_size=2)  # room for the joiner once they left
    feed = Feed(later)
    policy._run_continuous(first, feed)
    assert [type(r).__name__ for r in feed.results] == ["Completion"] * 3, feed.results
    assert feed.results[2].output_ids == policy.generate_batch([later])[0].output_ids


def test_event_loop_stays_responsive(tiny):
    async def run():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.005)

        t = asyncio.create_task(ticker())
        await tiny.generate(_req(PROMPTS[1], n=200, temperature=0.0))
        t.cancel()
        return ticks

    assert asyncio.run(run()) > 5


def test_prompt_budget_truncates(tiny):
    small = HFPolicy(tiny.model, tiny.tokenizer, max_context_tokens=80)
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "TASK"}]
    for i in range(10):
        msgs += [
            {"role": "assistant", "content": f"reply {i} " * 5},
            {"role": "user", "content": f"obs {i} " * 5},
        ]
    comp = small.generate_batch([GenerationRequest(messages=msgs, sampling=SamplingParams(8, 0.0))])[0]
    assert comp.prompt_truncated and len(comp.prompt_ids) <= 80 - 8


@pytest.mark.slow
def test_real_smollm2_greedy_generation():
    t0 = time.perf_counter()
    policy = HFPolicy("smollm2", device="cpu")  # bf16 by default
    load_s = time.perf_counter() - t0
    req = GenerationRequest(
        messages=[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
        sampling=SamplingParams(max_new_tokens=20, temperature=0.0),
    )
    comp = policy.generate_batch([req])[0]
    assert "Paris" in comp.text
    assert comp.output_ids and len(comp.output_ids) == len(comp.logprobs)
    assert policy.tokenizer.decode(comp.prompt_ids).startswith("<|im_start|>system")
    assert load_s < 60


def test_bad_request_fails_alone(tiny):
    async def run():
        bad = _req("hi", n=tiny.max_context_tokens + 5, temperature=0.0)
        return await asyncio.gather(
            tiny.generate(bad), tiny.generate(_req("hi", n=4)), return_exceptions=True
        )

    bad, good = asyncio.run(run())
    assert isinstance(bad, ValueError) and "leaves no room" in str(bad)
    assert len(good.output_ids) == 4
    with pytest.raises(ValueError, match="leaves no room"):
        tiny.generate_batch([_req("hi", n=tiny.max_context_tokens)])
