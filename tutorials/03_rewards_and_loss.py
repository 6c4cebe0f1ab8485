# %% [markdown]
# # Tutorial 3 — rewards, baselines and the CISPO loss
#
# All the math of SPEC.md §4 lives once in `common/rl` as small pure functions. We use each on numbers
# small enough to check by hand.

# %%
import torch

from common.rl import (
    cispo_loss,
    depth_weights,
    execution_advantages,
    launch_rewards,
    ranking_loss,
    rubric_advantages,
)
from common.rl.rewards import TreeNode

# %% [markdown]
# **Execution**: root reward R (0/1), child reward s (its rubric score); the baseline of rollout i is the
# mean of the OTHER rollouts' ROOT rewards (leave-one-out).

# %%
print(execution_advantages([1.0, 0.0], [[1.0, 0.5], [0.0, 0.75]]))  # b = [0, 1]

# %% [markdown]
# **Delegation**: a launch gets R x |leaves under its event| / |all leaves|.

# %%
nodes = [TreeNode("r", None), TreeNode("a", "r", 1), TreeNode("b", "r", 1), TreeNode("c", "r", 4)]
print(launch_rewards(1.0, [("r", 1), ("r", 4)], nodes))  # 2/3 and 1/3

# %% [markdown]
# **Rubric**: within one counterfactual group, successes should outscore failures by a margin of 0.2.

# %%
L = ranking_loss([0.9, 0.5, 0.3, 0.6], [True, True, False, False])
print("L_rank =", L, "-> reward", -L, "; LOO over groups:", rubric_advantages([-L, 0.0]))

# %% [markdown]
# **Depth weights** give each depth the same total say; **CISPO** multiplies the (stopped) clipped
# importance ratio by the advantage and the log-prob, token-mean over every trained token.

# %%
print(depth_weights([0, 0, 0, 1], ["r1", "r1", "r2", "c1"]))
logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
loss, metrics = cispo_loss(logp, torch.tensor([[-1.1, -2.0, -9.0]]), torch.tensor([0.5]),
                           torch.tensor([[1.0, 1.0, 0.0]]))
loss.backward()
print(loss.item(), metrics, logp.grad)
