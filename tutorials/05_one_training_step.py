# %% [markdown]
# # Tutorial 5 — one training step by hand: trees -> stage batch -> datums -> loss -> gradient -> AdamW
#
# Level 0's `train_on_batch` is a few lines because `common/` does the work. Here we open every box on a
# random-init `tiny` model and check, at the end, that the hand-made step lands on exactly the parameters
# level 0's step produces from the same batch (max |param diff| printed and asserted ~0).
#
# The batch is a Delegation-stage batch of one task with two rollouts: one that delegates (the oracle
# with `delegate=True`) and one that does not. Leaf credit then gives the delegating rollout's launches a
# positive advantage against the non-delegating one (tutorial 3). Replies are the oracle's, teacher-forced
# through the tiny model so they carry token ids and behaviour log-probs (level 0's `--oracle-mix`).
#
#     python tutorials/05_one_training_step.py     # 26 s on the 2-core CPU (2026-12-06); 37 s on an H100
#
# It runs on a GPU when there is one (`device` below; everything else follows the model): 37 s on one H100
# (2026-12-07, launch to exit; the tiny model gains nothing from a GPU, CUDA's start-up costs), measured by `python bench/bench_laptop_gpu.py --part tutorials` (bench/RESULTS.md, "On a laptop GPU").

# %%
import asyncio
import copy
import math
import time
from dataclasses import replace

import torch

from common.agent.runtime import run_root
from common.envs import make_env
from common.envs.textcraft.tasks import generate_tasks
from common.policy import make_policy
from common.policy.forced import TeacherForcedPolicy
from common.policy.hf import HFPolicy
from common.policy.models import load_model
from common.rl.batch import build_stage_batch
from common.rl.loss import token_logprobs
from common.run.optim import make_optimizer
from common.train_config import TrainConfig, laptop_rollout
from level0_single_process.train import train_on_batch

torch.set_num_threads(1)
torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"  # a GPU when there is one
t_start = time.perf_counter()
model, tok = load_model("tiny", dtype="float32", seed=0, device=device)
cfg = TrainConfig.make(model="tiny", lr=1e-3)  # a large lr so that one step visibly moves the weights
rcfg = replace(laptop_rollout(), max_steps=6, temperature=0.0, max_new_tokens=512)

# %% [markdown]
# ## 1. Trees
# %%
task = generate_tasks(split="train", n=1, seed=4, difficulty="hard")[0]
sampler = HFPolicy(model, tok, seed=0)
trees = []
for spec in ("oracle-delegate", "oracle"):
    teacher = make_policy(spec, env="textcraft")
    policy = TeacherForcedPolicy(sampler, teacher, oracle_mix=1.0, max_prompt_tokens=rcfg.max_prompt_tokens)
    trees.append(asyncio.run(run_root(task, make_env("textcraft"), policy, rcfg)))
print([(t.success, len(t.committed_nodes())) for t in trees])
assert all(t.success for t in trees) and len(trees[0].committed_nodes()) > 1 == len(trees[1].committed_nodes())

# %% [markdown]
# ## 2. Stage batch -> datums
# One datum per launch step of the delegating root: only the launch-statement tokens are trained
# (`loss_mask`), with the leaf-credit advantage; depth weights over the batch (mean 1).
# The zero-variance rule looks at ALL the group's datums: here there is one (one launch), so TextCraft's
# rule (`"drop"`) would drop it as "no signal"; we keep it (`"keep"`, TextWorld's rule) to have a batch.

# %%
batch = build_stage_batch("delegation", [trees], zero_variance="keep", tokenizer=tok)
for d, w in zip(batch.datums, batch.weights, strict=True):
    print(f"datum: {len(d.prompt_ids)} prompt + {len(d.output_ids)} output tokens, "
          f"{d.num_trained_tokens} trained, A={d.advantage:.4f}, w={w:.3f}")  # fmt: skip
assert batch.datums and all(d.advantage > 0 for d in batch.datums)
assert abs(sum(batch.weights) / len(batch.weights) - 1.0) < 1e-9

# %% [markdown]
# ## 3. Loss and gradient by hand
# For each datum: logits of prompt+output, the log-prob of each output token (position t predicts
# token t+1), the CISPO term on trained tokens, divided by the batch's trained-token count |M|.

# %%
hand = copy.deepcopy(model).train()
n_tokens = sum(d.num_trained_tokens for d in batch.datums)
loss_hand = 0.0
for d, w in zip(batch.datums, batch.weights, strict=True):
    ids = torch.tensor([d.prompt_ids + d.output_ids], device=device)  # [1, P+T]
    logits = hand(input_ids=ids).logits  # [1, P+T, V]
    P = len(d.prompt_ids)
    logp = token_logprobs(logits[:, P - 1 : -1], ids[:, P:])[0]  # [T]
    rho = torch.exp(logp.detach() - torch.tensor(d.behaviour_logprobs, device=device))  # [T]
    mask = torch.tensor(d.loss_mask, dtype=torch.bool, device=device)  # [T]
    term = -(rho.clamp(0, 5.0) * w * d.advantage * logp)[mask].sum() / n_tokens
    term.backward()
    loss_hand += term.item()

# %% [markdown]
# ## 4. Clip the global gradient norm, then AdamW by hand
# AdamW (decoupled weight decay): p <- p(1 - lr wd); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
# p <- p - lr * (m / (1-b1)) / (sqrt(v / (1-b2)) + eps). First step: m = (1-b1) g, v = (1-b2) g^2.

# %%
o = cfg.optim
params = [p for p in hand.parameters() if p.grad is not None]
grad_norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in params))
scale = min(1.0, o.grad_clip / (grad_norm + 1e-6))
with torch.no_grad():
    for p in hand.parameters():
        g = torch.zeros_like(p) if p.grad is None else p.grad * scale
        m, v = (1 - o.beta1) * g, (1 - o.beta2) * g * g
        p.mul_(1 - o.lr * o.weight_decay)
        p.sub_(o.lr * (m / (1 - o.beta1)) / ((v / (1 - o.beta2)).sqrt() + 1e-8))

# %% [markdown]
# ## 5. The same step with level 0
# %%
before = {n: p.detach().clone() for n, p in model.named_parameters()}
lib = train_on_batch(model, make_optimizer(model, o), batch, cfg)
with torch.no_grad():
    diff = max(float((p - q).abs().max()) for p, q in zip(model.parameters(), hand.parameters(), strict=True))
    moved = max(float((p - before[n]).abs().max()) for n, p in model.named_parameters())
print(f"loss by hand {loss_hand:.6f} | level 0 {lib['loss/cispo']:.6f}")
print(f"grad norm by hand {grad_norm:.6f} | level 0 {lib['grad_norm']:.6f}")
print(f"TUTORIAL05 max_param_diff {diff:.2e} (the step moved parameters by up to {moved:.2e}) "
      f"on {device} in {time.perf_counter() - t_start:.0f} s")  # fmt: skip
assert abs(loss_hand - lib["loss/cispo"]) <= 1e-6 * max(1.0, abs(loss_hand))
assert abs(grad_norm - lib["grad_norm"]) <= 1e-5 * grad_norm
# ~1e-7 is float32's resolution on weights of size ~1: the two steps differ only in summation order. On a GPU
# the kernels' summation order differs more, and AdamW's first step, g / (|g| + eps), magnifies it where |g| is
# near eps (H100, 2026-12-07: 3.8e-06 of 1.0e-03, 0.4 %)
assert moved > 1e-4 and diff <= (1e-3 if device == "cpu" else 1e-2) * moved

# %% [markdown]
# ## GPU notes
# On a GPU this tutorial runs there as it is (the test model stays in float32, so both steps are still
# compared to float32 rounding; CUDA's fused AdamW sums in another order than the hand-made update). A
# real run on a GPU computes in bf16 with fp32 master copies in the optimizer (`--dtype auto` on CUDA,
# `common/run/optim.py`); fused AdamW kernels are used on CUDA. The
# optimizer step of a Qwen3-4B-shaped model takes 0.067 s of a 1.40 s step on one H200 (bench/RESULTS.md,
# "Trainer efficiency"). Level 1 packs the datums into few forwards instead of one per datum (tutorial 7).
