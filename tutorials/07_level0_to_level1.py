# %% [markdown]
# # Tutorial 7 — from level 0 to level 1: what changes, and the proof that the math does not
#
# Level 1 (`level1_batched/train.py`) runs the same algorithm as level 0 with three systems changes:
#
# 1. **Rollouts in flight**: all the trees of a round run concurrently (`rollout_in_flight`), so the
#    policy sees many requests at once and generates them in one batch (`--generation-batch-size`).
# 2. **Packing**: instead of one forward per datum, datums are packed first-fit-decreasing into rows of at
#    most `--max-tokens-per-microbatch` tokens (`pack_microbatches`); position ids restart per datum so
#    each datum attends only to itself (`packed_logprobs`).
# 3. **Data parallel**: under `torchrun` each rank trains a token-balanced shard (`balanced_shards`),
#    every rank divides by the GLOBAL trained-token count, and the gradients are summed (all-reduce).
#
# None of these may change a number. The recorded fixture `tests/fixtures/rl_fixture.json` holds datums of
# each stage and the golden loss / gradient norm level 0 produced on the seed-0 `tiny` model; here level 0
# and level 1 (packed; and a 2-rank data-parallel split simulated in one process) are checked against it.
#
#     python tutorials/07_level0_to_level1.py     # ~1 min on 2 cores

# %%
import json
import math
import os
from pathlib import Path

import torch

from common.policy.models import load_model
from common.rl.datums import Datum
from level0_single_process.train import accumulate_gradients
from level1_batched.train import accumulate_gradients_packed, balanced_shards, pack_microbatches

torch.set_num_threads(1)  # a small model on a busy 2-core machine: one thread is faster
FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "rl_fixture.json"
fx = json.loads(FIXTURE.read_text())
if os.environ.get("SERA_TUTORIAL_QUICK"):  # the test suite's short run (tests/test_tutorials.py): one stage,
    # the smallest (3 datums); tests/test_level1.py checks every stage against the same golden numbers
    fx["stages"] = {"delegation": fx["stages"]["delegation"]}
print("fixture model", fx["model"], "| stages", {s: len(v["datums"]) for s, v in fx["stages"].items()})


def fresh():
    model, _ = load_model("tiny", dtype="float32", seed=0)  # the fixture's model
    return model.train()


def grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def norm(g):
    return math.sqrt(sum(float(t.pow(2).sum()) for t in g.values()))


# %% [markdown]
# ## Packing, on lengths you can check
# %%
print(pack_microbatches([5, 3, 4, 2], max_tokens=7))  # longest first into the first row with room
assert pack_microbatches([5, 3, 4, 2], max_tokens=7) == [[0, 3], [2, 1]]
print(balanced_shards([5, 1, 4, 2], 2))  # largest first onto the least-loaded rank
assert balanced_shards([5, 1, 4, 2], 2) == [[0, 1], [2, 3]]

# %% [markdown]
# ## The parity check on the fixture
# For every stage: level 0 (one forward per datum), level 1 with everything packed into one row, and a
# 2-rank data-parallel split (each "rank" computes its shard with the global |M|; the gradients summed).
# Tolerances are those of `tests/test_level1.py`: loss within 1e-5 x the size of the summed terms, grad
# norm relative 1e-4, gradients per tensor within 1e-4 x the largest gradient of the same loss with |A|
# (datums of one task carry LOO advantages of both signs on near-identical prompts: their gradients partly
# cancel, so the tolerance is judged against the size of the terms, not of their difference).

# %%
worst = {"loss": 0.0, "grad_norm_rel": 0.0, "grad_l1_vs_l0": 0.0}
for stage, st in fx["stages"].items():
    datums, weights, gold = [Datum(**d) for d in st["datums"]], st["weights"], st["golden"]
    n_tok = sum(d.num_trained_tokens for d in datums)
    scale = sum(
        abs(w * d.advantage) * sum(abs(b) for b, m in zip(d.behaviour_logprobs, d.loss_mask, strict=True) if m)
        for d, w in zip(datums, weights, strict=True)
    ) / n_tok  # the size of the terms the loss sums
    m0 = accumulate_gradients(l0 := fresh(), datums, weights)
    g0 = grads(l0)
    m1 = accumulate_gradients_packed(l1 := fresh(), datums, weights, max_tokens_per_microbatch=10**6)
    g1 = grads(l1)
    dp = fresh()  # two shards into the same .grad buffers == an all-reduce SUM of two ranks' gradients
    loss_dp = 0.0
    for shard in balanced_shards([len(d.prompt_ids) + len(d.output_ids) for d in datums], 2):
        loss_dp += accumulate_gradients_packed(
            dp, [datums[i] for i in shard], [weights[i] for i in shard], 10**6, num_tokens=n_tok
        )["loss/cispo"]
    gdp = grads(dp)
    absolute = [Datum(**{**d.__dict__, "advantage": abs(d.advantage)}) for d in datums]
    accumulate_gradients_packed(big := fresh(), absolute, weights, 10**6)
    g_abs = grads(big)
    for name, loss, g in (("level 0", m0["loss/cispo"], g0), ("level 1 packed", m1["loss/cispo"], g1),
                          ("level 1 DP x2", loss_dp, gdp)):  # fmt: skip
        dl, dn = abs(loss - gold["loss"]), abs(norm(g) - gold["grad_norm"]) / gold["grad_norm"]
        print(f"{stage:<10} {name:<15} loss {loss:.8f} (golden {gold['loss']:.8f}, |diff| {dl:.1e}) "
              f"grad norm {norm(g):.6f} (golden {gold['grad_norm']:.6f}, rel diff {dn:.1e})")  # fmt: skip
        assert dl <= 1e-5 * scale + 1e-9 and dn <= 1e-4
        worst["loss"], worst["grad_norm_rel"] = max(worst["loss"], dl), max(worst["grad_norm_rel"], dn)
    for g in (g1, gdp):
        for k in g0:
            d = float((g[k] - g0[k]).abs().max())
            assert d <= 1e-4 * float(g_abs[k].abs().max()) + 1e-12, (stage, k, d)
            worst["grad_l1_vs_l0"] = max(worst["grad_l1_vs_l0"], d)
print(f"TUTORIAL07 max_loss_diff {worst['loss']:.1e} max_grad_norm_rel_diff {worst['grad_norm_rel']:.1e} "
      f"max_grad_diff_l1_vs_l0 {worst['grad_l1_vs_l0']:.1e}")  # fmt: skip

# %% [markdown]
# ## Running level 1
#     sera train --level 1 --model tiny --steps 3                          # one process
#     torchrun --nproc_per_node 2 -m level1_batched.train --model tiny     # 2 ranks (gloo on CPU, nccl on GPUs)
#     sera train --level 1 --model tiny --steps 3 --max-staleness 1     # the next round rolls out during the step
#
# ## One round ahead (`--max-staleness 1`)
# A synchronous round leaves the engine idle during the optimizer step and the trainer idle during the
# rollouts. With `--max-staleness 1` the next round's rollouts start as soon as this round's batch is built
# and run while it trains (`level1_batched/overlap.py`): they are sampled by weights one optimizer step old,
# and CISPO's ratio `pi_theta / pi_behaviour` against the behaviour log-probs recorded with every token is
# exactly the correction that takes. Each tree and datum records the version that sampled it
# (`meta["policy_version"]`); nothing more than one version behind is trained; the stage of the round ahead
# is known before it starts, and a checkpoint never counts an in-flight round's tasks, so a resumed run redoes
# that round once. `offpolicy/gap_mean` in metrics.jsonl is the mean lag (1 for a round rolled out during a
# step, 0 after a round without an update). Default 0: the paper's synchronous rounds, bit for bit today's loop.
#
# What it buys, measured on one H100 (bench/RESULTS.md, "Rollouts overlapping training on one H100"; RAO, 8 tasks
# x 8 rollouts, 12 rounds each): the median round went from 17.8 s (13.5 s of rollouts + 4.3 s of training) to
# 15.3 s, not to 13.5 s. Overlapped, the step took 9.2 s and the rollouts 15.1 s: the trainer and vLLM's engine
# core are two processes, and a GPU runs two processes' kernels by turns (time-slicing), so each slows the other
# (`python bench/bench_stream_share.py` shows it with plain matmuls: decode-like steps 1.45x slower beside a
# training load in another process). The shorter the step next to the rollouts, the more of it is hidden.
# A second window: with the trainer given room to skip activation checkpointing (2.7-s steps) the N=1 round
# was still 1.12x the N=0 rollout, and under CUDA MPS (a daemon through which two processes' kernels run at
# once) 1.08x, under the 1.10x the issue asked: the overlapped step slowed 1.3x instead of 2.2x. To run
# overlapped on one card, start the daemon first (a user-space process; the card's settings stay as they are):
#     export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log; nvidia-cuda-mps-control -d
#     sera train --level 1 --engine vllm --max-staleness 1 ...      # stop it after: echo quit | nvidia-cuda-mps-control
#
# ## GPU notes
# On a laptop GPU `sera train --level 1` batches generation on the GPU; `--engine vllm` uses an in-process
# vLLM engine synced after every optimizer step. Measured (bench/RESULTS.md, "Level 0 vs level 1"): tiny
# model rollouts 414 tok/s (level 0) vs 3,676 tok/s (level 1) on one H200; a SmolLM2-sized model in bf16
# 43 vs 159 tok/s. With vLLM, SmolLM2 generates 17,796 tok/s at batch 64 on one H200 (bench/RESULTS.md,
# "Engines"). On a CPU one datum per row is fastest (sdpa's packed mask is dense); on a GPU the varlen
# path (`--fast-trainer`) packs 16K-token rows (bench/RESULTS.md, "Trainer efficiency").
