# %% [markdown]
# # Tutorial 9 — a supervised warm start, measured (the CPU-sized version)
#
# A small model almost never solves a task, so every RL group has the same outcome and SERA has no
# signal. `sera sft` fixes the starting point: the environment's oracle writes whole recursive trees
# (agent steps, delegations, rubrics, scores), the REAL runtime records every call with the exact token
# ids an `HFPolicy` would send, and the model is trained on the replies only (`common/sft/data.py`,
# `level0_single_process/sft.py`).
#
# What fits on a 2-core CPU in a few minutes is NOT SmolLM2: one SmolLM2 forward+backward on a ~1,000-token
# example costs ~15-20 s on 2 idle cores (measured: 571 s for 4 examples on this shared, 6x
# oversubscribed machine), so even 20 SFT steps take ~25 min. This tutorial therefore uses the random-init
# `tiny` model (which cannot solve a task even by memorizing: trained on 2 tasks' trajectories for 150
# steps it reaches 0.98 token accuracy and solves 0 of them, bench/RESULTS.md) and the shortest role,
# **scoring** (a ~50-token JSON verdict after a ~900-token prompt), and
# measures what SFT moves: the share of held-out score replies that parse, and how many state the child's
# true outcome. Then RL starts from that checkpoint with two of the paper's presets, SERA and RAO, and
# shows what differs between them at this scale: which stages train and whether rubrics are written and
# ranked. It does not show one beating the other (that needs a real model and many steps: the SmolLM2 /
# GPU version is `bash bench/learning.sh`, see `bench/RESULTS.md`).
#
#     python tutorials/09_learning_demo.py         # 105 s on the 2-core CPU (2026-12-06; 2-4 min when shared)
#
# On a GPU it runs there by itself (the engine, `sera sft`'s trainer and level 0 each put the model on CUDA
# when torch sees one): 68 s on one H100 (2026-12-07, launch to exit), measured by
# `python bench/bench_laptop_gpu.py --part tutorials`
# (bench/RESULTS.md, "On a laptop GPU").

# %%
import math
import os
import tempfile
import time
from pathlib import Path

import torch

from common.agent.rubric import ScoreParseError, parse_score
from common.envs.textcraft.tasks import generate_tasks
from common.policy.base import GenerationRequest, SamplingParams
from common.policy.hf import HFPolicy
from common.policy.models import load_tokenizer
from common.sft.config import SFTConfig
from common.sft.data import oracle_trees
from common.train_config import laptop_rollout
from level0_single_process.sft import sft

torch.set_num_threads(1)  # on a busy 2-core machine one thread is faster than two fighting for cores
t_start = time.perf_counter()

# %% [markdown]
# ## 1. Held-out score prompts
# The paper's item split: training tasks come from the `train` split, these come from `val` (other target
# items), so the model never trains on them. Each delegation in an oracle tree yields one score call; half
# of the children's steps are random (`child_noise=0.5`) so some children fail and the truthful verdict is
# sometimes `false`. This scoring demo uses the plain oracle's shorter trees (no look-up step, section 1b)
# for both its training and its held-out prompts: with the look-up the children's trajectories, and so the
# score prompts, are longer, and 40 steps no longer teach the tiny model the verdict format (parse rate
# 0.00 after SFT, measured). What is trained here is the verdict, which needs no recipe.

# %%
tok = load_tokenizer("smollm2")
val_tasks = generate_tasks(split="val", n=4, seed=1, difficulty="easy")
val_trees = oracle_trees("textcraft", val_tasks, tok, 8192, laptop_rollout(), seed=1, child_noise=0.5)
held_out = [
    (n.score_call, bool(n.success)) for t in val_trees for n in t.nodes.values() if n.score_call is not None
]
n_fail = sum(not s for _, s in held_out)
print(f"{len(held_out)} held-out score prompts, {n_fail} with a failed child "
      f"(always answering success=true would be right on {1 - n_fail / len(held_out):.2f})")  # fmt: skip


def score_quality(model_dir_or_name: str) -> tuple[float, float]:
    """(share of replies that parse as a score, share whose success equals the child's real outcome)."""
    policy = HFPolicy(model_dir_or_name, dtype="float32", max_batch_size=8)
    reqs = [
        GenerationRequest(c.messages, SamplingParams(64, temperature=0.0), role="score") for c, _ in held_out
    ]
    comps = policy.generate_batch(reqs)
    parsed = right = 0
    for comp, (_, success) in zip(comps, held_out, strict=True):
        try:
            score = parse_score(comp.text)
        except ScoreParseError:
            continue
        parsed += 1
        right += int(score.success == success)
    return parsed / len(held_out), right / len(held_out)


# %% [markdown]
# ## 1b. What the model may learn: only what it can see
# The oracle plans from the recipe book, which an agent never sees. Trained on replies that craft at once,
# SmolLM2 learned the format perfectly (reply-token accuracy 0.98) and invented recipes: 0/32 held-out
# tasks, 0/16 of its own training tasks (one H200, bench/RESULTS.md). So `sera sft`'s oracle first looks
# its recipes up (`look_up`, the default): the first cell walks the recipe tree with `get_info`, and every
# fact of the plan that follows is in the observation. The same SFT then solved 3 of 15 held-out tasks.

# %%
import asyncio  # noqa: E402

from common.envs.textcraft.env import TextCraftEnv  # noqa: E402
from common.envs.textcraft.oracle import oracle_reply  # noqa: E402
from common.envs.textcraft.tasks import plan_crafts  # noqa: E402


async def first_two_steps(task):
    env = TextCraftEnv()

    async def no_launch(request):
        raise RuntimeError("this demo does not delegate")

    session = env.root_session(env.make_world(task), task, no_launch)
    seen = await session.step(oracle_reply(session, look_up=True))
    plan = plan_crafts(session.world.book, session.world.inventory, dict(session.targets))
    done = await session.step(oracle_reply(session, look_up=True))
    return seen.observation, plan, done, session


observation, plan, done, session = asyncio.run(first_two_steps(val_tasks[0]))
print(observation)
used = [f"{st['target'][0]} x {session.world.book.recipe(st['target'][0]).result_count} <-" for st in plan.steps]
assert all(u in observation for u in used)  # every recipe the plan uses was printed first
assert session.success()  # ... and the plan then solves the task
print(f"the plan's {len(used)} crafts use only recipes printed above; task solved: {session.success()}")

# %% [markdown]
# ## 2. Before: the random-init model writes gibberish

# %%
before = score_quality("tiny")
print(f"before SFT: parse rate {before[0]:.2f}, verdict right {before[1]:.2f}")

# %% [markdown]
# ## 3. SFT on oracle score calls (train split), loss on the reply tokens only
# The oracle trees are built with the CodeAct worker's fixed-order mode, so the same seed gives the same
# examples and this cell repeats exactly: 60 steps reach a parse rate of 0.91 on the held-out prompts
# (measured twice, identical). With the racing default executor the data varied run to run and 40 steps
# gave 0.00-0.18.

# %%
WORK = tempfile.TemporaryDirectory(prefix="sera_tutorial09_")  # deleted when Python exits
out = Path(WORK.name) / "sft"
cfg = SFTConfig.make(model="tiny", out=str(out), n_tasks=8, child_noise=0.5, roles="score", look_up=False,
                     steps=60, batch_size=4, lr=3e-3, warmup=2, save_every=60)  # fmt: skip
history = sft(cfg, progress=False)
first, last = history[0]["loss/sft"], history[-1]["loss/sft"]
print(f"SFT loss {first:.2f} -> {last:.2f}; token accuracy "
      f"{history[0]['sft/token_acc']:.2f} -> {history[-1]['sft/token_acc']:.2f}")  # fmt: skip

# %% [markdown]
# ## 4. After: the same held-out prompts, greedy

# %%
after = score_quality(str(out / "model"))
print(f"after SFT:  parse rate {after[0]:.2f}, verdict right {after[1]:.2f}")
print(f"wall time {time.perf_counter() - t_start:.0f} s; curves in {out}/curves.png")

# %%
assert last < 0.5 * first, (first, last)
assert after[0] > before[0], (before, after)

# %% [markdown]
# ## 5. Then RL from the warm start: SERA vs RAO, two steps each
# Both runs start from the SFT checkpoint (`--model DIR` takes it like any model) with the same tasks and
# seeds. SERA's cycle here is one Execution step then one Rubric step: every child is scored against a rubric
# written before it ran, and the Rubric-stage rollouts run K=4 counterfactual branches per delegation, whose
# verified outcomes rank the rubric (pair accuracy) and train the rubric writer. RAO writes no rubric: a
# child's reward is its verified outcome and only the Execution stage exists. The tiny model still cannot
# act, so 70 % of the replies are the oracle's, teacher-forced through the model (`--oracle-mix`), and
# the fixed-order CodeAct worker keeps the run repeatable (`--codeact-executor worker-ordered`).

# %%
from common.train_config import TrainConfig  # noqa: E402
from level0_single_process.train import train  # noqa: E402

runs = {}
# SERA_TUTORIAL_QUICK: the test suite's short run (tests/test_tutorials.py); RAO's one step shows its point
quick = bool(os.environ.get("SERA_TUTORIAL_QUICK"))
for method, schedule in (("sera", "execution:1,rubric:1"), ("rao", "execution:1")):
    rl_cfg = TrainConfig.make(
        model=str(out / "model"), method=method, schedule=schedule, steps=1 if quick and method == "rao" else 2,
        out=str(out.parent / method),
        env="textcraft", tasks_per_step=2, rollouts_per_task=2, max_steps=3, max_new_tokens=16,
        rubric_max_new_tokens=16, oracle_mix=0.7, score_noise=0.3, difficulty="medium", n_tasks=16,
        max_task_replacements=3, max_idle_rounds=4, lr=1e-3, codeact_executor="worker-ordered",
        dtype="float32",  # the tiny model from disk: --dtype auto would pick bf16 on a CPU with AVX512-BF16
    )  # fmt: skip
    runs[method] = train(rl_cfg, progress=False)
    for h in runs[method]:
        print(f"{method:<4} round {h['round']} {h['stage']:<9} datums {h['batch/datums']:>2} trained tokens "
              f"{h.get('loss/tokens', 0):>5.0f} root success {h['reward/root_success']:.2f} "
              f"rubric pair accuracy {h['rubric/pair_accuracy']:.2f}")  # fmt: skip

# %%
sera_rubric = [h for h in runs["sera"] if h["stage"] == "rubric" and not h["train/skipped"]]
assert sera_rubric and sera_rubric[0]["loss/tokens"] > 0  # SERA trained its rubric writer
assert math.isfinite(sera_rubric[0]["rubric/pair_accuracy"])  # ... on branches ranked by its own scores
assert all(h["stage"] == "execution" for h in runs["rao"])  # RAO has no other stage
assert all(math.isnan(h["rubric/pair_accuracy"]) for h in runs["rao"])  # and writes no rubric
assert all(h["grad_norm"] > 0 for r in runs.values() for h in r if not h["train/skipped"])
print(f"TUTORIAL09 sera_rubric_pair_accuracy {sera_rubric[0]['rubric/pair_accuracy']:.2f} "
      f"wall {time.perf_counter() - t_start:.0f} s on {'cuda' if torch.cuda.is_available() else 'cpu'}")  # fmt: skip
