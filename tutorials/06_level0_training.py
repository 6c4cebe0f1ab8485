# %% [markdown]
# # Tutorial 6 — a level-0 training run, end to end
#
# `level0_single_process/train.py` is the whole algorithm in one file. Here we run it for three optimizer
# steps with the random-init `tiny` model, one of each stage: Execution (every agent's own reward),
# Delegation (a parent's choice to delegate) and Rubric (the rubric writer, ranked on counterfactual
# branches). A random model never succeeds, so RL has no signal; the `oracle_mix` option lets the scripted
# oracle write some replies that are teacher-forced through the model (off-policy) and `score_noise` flips
# some of its scores, so every stage produces datums. For the real thing run `sera train` (SmolLM2): its two
# steps are both Execution-stage steps (the default cycle is execution:16,delegation:2,rubric:2), which is
# why this tutorial is where the other two stages train.
#
#     python tutorials/06_level0_training.py     # 39 s on the 2-core CPU (2026-12-06; up to a minute when shared)
#
# On a GPU it runs there by itself: level 0 puts the model on CUDA when torch sees one (and decodes
# through CUDA graphs, `common/policy/slots.py`): 48 s on one H100 (2026-12-07, launch to exit), measured by
# `python bench/bench_laptop_gpu.py --part tutorials` (bench/RESULTS.md, "On a laptop GPU").

# %%
import json
import tempfile
import time
from pathlib import Path

import torch

from common.rl.batch import METRIC_NAMES
from common.train_config import TrainConfig
from level0_single_process.train import train

WORK = tempfile.TemporaryDirectory(prefix="sera_tutorial06_")  # deleted when Python exits
out = Path(WORK.name) / "run"
# One task per step; sibling agents act on their shared world in one fixed order (`worker-ordered`), so the
# run repeats exactly: a Rubric round needs a counterfactual group whose branches differ, which takes a few
# rounds here (a round without a trained token does not move the clock; the stage is retried). The Rubric
# step this run takes has one such group, and a group's leave-one-out advantage needs another group to
# compare with: it is 0, so that step's gradient is zero (AdamW still decays the weights). Tutorial 9 takes
# Rubric steps on two tasks per step, with a gradient and the rubric pair accuracy; tutorial 4 builds the
# rubric datums of a mixed group by hand.
cfg = TrainConfig.make(model="tiny", steps=3, out=str(out), schedule="execution:1,delegation:1,rubric:1",
                  difficulty="medium", n_tasks=16, tasks_per_step=1, rollouts_per_task=2, max_steps=3,
                  max_new_tokens=16, rubric_max_new_tokens=16, oracle_mix=0.7, score_noise=0.3,
                  max_task_replacements=3, max_idle_rounds=4, codeact_executor="worker-ordered")
t_start = time.perf_counter()
history = train(cfg, progress=False)
device = "cuda" if torch.cuda.is_available() else "cpu"  # where train() put the model

# %% [markdown]
# One JSON line of metrics per step (the same names in every tier), the offline log of every tree, a
# PNG of the curves and a resumable checkpoint:

# %%
print(sorted(p.name for p in out.iterdir()))
rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
for r in rows:
    print(f"round {r['round']} step {r['step']} {r['stage']:<10} loss {r['loss/cispo']:.4f} "
          f"grad_norm {r['grad_norm']:.4f} root_success {r['reward/root_success']:.2f}")  # fmt: skip
assert len(rows) == len(history) and all(name in rows[0] for name in METRIC_NAMES)
updated = [r for r in rows if not r["train/skipped"]]  # a round without a trained token makes no step
assert [r["stage"] for r in updated] == ["execution", "delegation", "rubric"]  # the schedule: one of each
assert all(r["loss/tokens"] > 0 and r["loss/cispo"] == r["loss/cispo"] for r in updated)  # trained, finite
assert any(r["grad_norm"] > 0 for r in updated)

# %% [markdown]
# `curves.png` plots every metric against the step (open it in any image viewer):

# %%
png = (out / "curves.png").read_bytes()
print(f"curves.png: {len(png):,} bytes")
assert png[:8] == b"\x89PNG\r\n\x1a\n"
print(f"TUTORIAL06 steps {len(updated)} stages {','.join(r['stage'] for r in updated)} "
      f"last_loss {updated[-1]['loss/cispo']:.4f} on {device} in {time.perf_counter() - t_start:.0f} s")

# %% [markdown]
# ## GPU notes
# On a laptop GPU, `sera train` (SmolLM2-135M) puts the model on the GPU by itself, decodes through CUDA
# graphs and stops with one line naming the setting to lower when the card is too small (its cost there:
# `python bench/bench_laptop_gpu.py`, bench/RESULTS.md "On a laptop GPU"); `--dtype bfloat16`
# halves memory (fp32 master weights stay in the optimizer; on a CPU they and AdamW's moments wait in files
# under the run's optimizer_state/ between steps, `--optimizer-state`). On this CPU one SmolLM2 round takes 100-250 s
# and a training step on ~20 datums ~20 s (bench/RESULTS.md, "Level 0 with SmolLM2 on CPU"). For more than
# a few steps use level 1 (tutorial 7): on one H200 its rollouts run 8.9x faster than level 0's with the
# tiny model (bench/RESULTS.md, "Level 0 vs level 1"). The paper's sizes: `sera train --paper` (GPU).
