# %% [markdown]
# # Tutorial 2 — the recursive runtime, frozen rubrics and the tree
#
# `common.agent.runtime.run_root(task, env, policy, config)` runs the root agent. When a reply delegates,
# the runtime (1) asks the policy for a rubric in a fresh chat and FREEZES it, (2) runs the child on the
# same live world with its own step budget, (3) asks the policy to score the child against the frozen
# rubric. Everything is recorded token-exact in a `Tree`.
#
# Here the policy is the scripted oracle (no model), so this runs in a second.

# %%
import asyncio

from common.agent.runtime import RuntimeConfig, run_root
from common.agent.viewer import render_tree_terminal
from common.envs import make_env
from common.envs.textcraft.oracle import oracle_reply
from common.envs.textcraft.tasks import generate_tasks
from common.policy.scripted import OraclePolicy

task = generate_tasks(split="train", n=1, seed=4, difficulty="hard")[0]
policy = OraclePolicy(lambda s: oracle_reply(s, delegate=True, max_delegation_depth=2))
tree = asyncio.run(run_root(task, make_env("textcraft"), policy, RuntimeConfig()))
render_tree_terminal(tree)

# %% [markdown]
# Each child carries its frozen rubric (weights renormalised to 1) and its score s in [0, 1].
# In training, non-root nodes are rewarded with s; the root with the environment's verdict.

# %%
child = tree.children("0")[0]
print([(i["name"], round(i["weight"], 3)) for i in child.rubric["rubric_items"]], "s =", child.score)

# %% [markdown]
# Counterfactual branches: at a delegation, K copies of the same child run on isolated forks of one
# snapshot, under ONE rubric. Branch 0 is the live one. Their verified labels train the rubric writer.

# %%
tree = asyncio.run(run_root(task, make_env("textcraft"), policy, RuntimeConfig(counterfactual_k=4)))
groups = {}
for n in tree.nodes.values():
    if n.branch_group:
        groups.setdefault(n.branch_group, []).append((n.branch_index, n.committed, n.branch_label, n.score))
print(groups)

# %% [markdown]
# `sera rollout` does the same from the shell and appends the tree to an offline log;
# `sera view LOG --html out.html` writes a page you can click through.
