# %% [markdown]
# # Tutorial 4 — a level-0 training run
#
# `level0_single_process/train.py` is the whole algorithm in one file. Here we run it for two optimizer
# steps with the random-init `tiny` model. A random model never succeeds, so RL has no signal; the
# `oracle_mix` option lets the scripted oracle write some replies that are teacher-forced through the
# model (off-policy) so every stage produces datums. For the real thing run `sera train` (SmolLM2).

# %%
import json
import tempfile
from pathlib import Path

from common.train_config import TrainConfig
from level0_single_process.train import train

out = Path(tempfile.mkdtemp()) / "run"
cfg = TrainConfig.make(model="tiny", steps=2, out=str(out), schedule="execution:1,delegation:1", difficulty="medium",
                  tasks_per_step=1, rollouts_per_task=2, max_steps=3, max_new_tokens=16, oracle_mix=0.7)
history = train(cfg, progress=False)

# %% [markdown]
# One JSON line of metrics per step (the same names in every tier), the offline log of every tree, a
# PNG of the curves and a resumable checkpoint:

# %%
print(sorted(p.name for p in out.iterdir()))
print(json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["stage"])
