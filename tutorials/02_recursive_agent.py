# %% [markdown]
# # Tutorial 2 — the recursive agent: delegation, frozen rubrics, scores, the tree
#
# `common.agent.runtime.run_root(task, env, policy, config)` runs the root agent. When a reply delegates,
# the runtime (1) asks the policy for a rubric in a fresh chat and FREEZES it, (2) runs the child on the
# same live world with its own step budget, (3) asks the policy to score the child against the frozen
# rubric. Everything is recorded token-exact in a `Tree`.
#
# The policy here is `oracle-delegate` (the scripted TextCraft oracle that delegates subgoals), built with
# `common.policy.make_policy` exactly as `sera rollout --policy oracle-delegate` does. No model: a second.
#
#     python tutorials/02_recursive_agent.py

# %%
import asyncio
import os
from pathlib import Path

from common.agent.runtime import RuntimeConfig, run_root
from common.agent.viewer import render_tree_terminal, write_html
from common.envs import make_env
from common.envs.textcraft.tasks import generate_tasks
from common.policy import make_policy

task = generate_tasks(split="train", n=1, seed=4, difficulty="hard")[0]
policy = make_policy("oracle-delegate", env="textcraft")
tree = asyncio.run(run_root(task, make_env("textcraft"), policy, RuntimeConfig(temperature=0.0)))
render_tree_terminal(tree)

# %% [markdown]
# ## The tree's structure
# The root (id `0`, depth 0) delegated; its children (ids `0.1`, `0.2`, ...) sit at depth 1. Every
# committed node is part of the tree the parent continued from.

# %%
root = tree.root
children = tree.children(root.node_id)
print("nodes", len(tree.nodes), "| children of the root", [c.node_id for c in children],
      "| depth", tree.depth_max(), "| leaves", [n.node_id for n in tree.leaves()])  # fmt: skip
assert root.parent_id is None and root.depth == 0
assert len(children) >= 2, "the delegating oracle splits a hard task into several subgoals"
assert all(c.parent_id == root.node_id and c.depth == 1 for c in children)
assert tree.depth_max() == 1 and len(tree.leaves()) == len(children)  # the children are the leaves
assert tree.success is True

# %% [markdown]
# ## The frozen rubric and the score
# Each child carries the rubric its parent wrote BEFORE the child ran: items with weights renormalised to
# sum to 1. After the child ends, the parent scores it against that rubric: s in [0, 1] (0 when the scorer
# says it failed). In training, non-root nodes are rewarded with s; the root with the environment's verdict.

# %%
child = children[0]
items = child.rubric["rubric_items"]
print([(i["name"], round(i["weight"], 3)) for i in items], "| s =", child.score, "| success", child.success)
weight_sum = sum(i["weight"] for i in items)
assert abs(weight_sum - 1.0) < 1e-9, weight_sum
assert all(0.0 <= c.score <= 1.0 for c in children)
assert all((c.score > 0) == bool(c.success) for c in children)  # the oracle scorer is truthful
print("TUTORIAL02 children", len(children), "mean_score", sum(c.score for c in children) / len(children))

# %% [markdown]
# ## The viewer
# `write_html` writes one self-contained page: click a node to read its messages, rubric and score. The
# CLI does the same: `sera rollout ... --log runs/r.jsonl` then `sera view runs/r.jsonl --html r.html`.
# The page stays after the script ends (`runs/` is the repository's ignored output folder;
# `SERA_TUTORIAL_OUT=DIR` puts it elsewhere): open it in a browser.

# %%
OUT = Path(os.environ.get("SERA_TUTORIAL_OUT", "runs/tutorials"))
page = write_html([tree], OUT / "02_tree.html")
html = page.read_text()
print(f"TUTORIAL02 wrote {page} ({len(html):,} bytes): open it in a browser")
assert html.lstrip().lower().startswith("<!doctype html")
assert all(c.node_id in html for c in children) and "goal_completed" in html

# %% [markdown]
# ## GPU notes
# With a model instead of the oracle (`--policy hf:smollm2`, or `openai:URL#MODEL` for a vLLM/SGLang
# server) the runtime is the same; only the policy's speed changes. On this CPU SmolLM2-135M generates
# 41.9 tok/s at batch 1 and 138.4 tok/s at batch 8 in bf16 (bench/RESULTS.md, "`hf` policy backend");
# on one H200 the level-1 vLLM engine reaches 17,796 tok/s at batch 64 (bench/RESULTS.md, "Engines").
# The agents of one tree run concurrently, so a batching backend serves their calls together.
