# %% [markdown]
# # Tutorial 3 — rewards, baselines, depth weights and the CISPO loss, by hand
#
# All the math of SPEC.md §4 lives once in `common/rl` as small pure functions. Here every quantity is
# first computed by hand (plain Python / torch), then by the library, and the two are asserted equal.
#
#     python tutorials/03_rewards_and_loss.py      # a few seconds

# %%
import math

import torch

from common.rl import (
    cispo_loss,
    delegation_advantages,
    depth_weights,
    execution_advantages,
    launch_rewards,
    loo_baseline,
    ranking_loss,
    rubric_advantages,
)
from common.rl.rewards import TreeNode


def close(a, b, tol=1e-9):
    return abs(a - b) <= tol


# %% [markdown]
# ## Execution reward
# Root reward R in {0, 1}; a child's reward is its rubric score s. The baseline of rollout i is the mean
# of the OTHER rollouts' ROOT rewards (leave-one-out), and every node of rollout i uses that baseline.
# Two rollouts: rollout 0 succeeded (R=1, child s=0.5), rollout 1 failed (R=0, child s=0.75).

# %%
R = [1.0, 0.0]
b = [R[1], R[0]]  # LOO with two rollouts: the other one's R
by_hand = [[1.0 - b[0], 0.5 - b[0]], [0.0 - b[1], 0.75 - b[1]]]
lib, flat = execution_advantages(R, [[1.0, 0.5], [0.0, 0.75]])
print("execution advantages by hand", by_hand, "| library", lib)
assert lib == by_hand and not flat
assert loo_baseline([1.0, 0.0, 1.0]) == [0.5, 1.0, 0.5]

# %% [markdown]
# ## Delegation: leaf credit, then LOO over rollouts
# A launch gets R x |leaves under its event| / |all leaves|. The root `r` launched `a` and `b` in step 1
# and `c` in step 4: 3 leaves, so the step-1 event earns 2/3 and the step-4 event 1/3.

# %%
nodes = [TreeNode("r", None), TreeNode("a", "r", 1), TreeNode("b", "r", 1), TreeNode("c", "r", 4)]
credit = launch_rewards(1.0, [("r", 1), ("r", 4)], nodes)
print("leaf credit", credit)
assert close(credit[0], 2 / 3) and close(credit[1], 1 / 3)
# A second rollout of the same task did not delegate (mean launch reward 0), a third launched once for 0.
# m = [mean(2/3, 1/3), 0, 0] -> baselines b_i = mean of the others' m.
m = [(2 / 3 + 1 / 3) / 2, 0.0, 0.0]
b = [(m[1] + m[2]) / 2, (m[0] + m[2]) / 2, (m[0] + m[1]) / 2]
lib = delegation_advantages([credit, [], [0.0]])
print("delegation advantages", lib)
assert close(lib[0][0], 2 / 3 - b[0]) and close(lib[0][1], 1 / 3 - b[0]) and close(lib[2][0], 0.0 - b[2])

# %% [markdown]
# ## Rubric: the ranking reward
# Within one counterfactual group (same subtask, same frozen rubric, K branches), verified successes
# should outscore failures by a margin of 0.2: L = mean over (success i, failure j) of max(0, 0.2 - (s_i -
# s_j)); the reward is -L; LOO over the task's groups gives the advantage. Tutorial 4 builds such a group.

# %%
s, y = [0.9, 0.5, 0.3, 0.6], [True, True, False, False]
pairs = [(si, sj) for si, yi in zip(s, y) for sj, yj in zip(s, y) if yi and not yj]
L_hand = sum(max(0.0, 0.2 - (si - sj)) for si, sj in pairs) / len(pairs)
L = ranking_loss(s, y)
print(f"L_rank by hand {L_hand:.6f} | library {L:.6f}; rubric advantages {rubric_advantages([-L, 0.0])}")
assert close(L, L_hand) and close(L, 0.075)
assert rubric_advantages([-L, 0.0]) == [-L - 0.0, 0.0 + L]

# %% [markdown]
# ## Depth weights
# T_d = distinct trajectories at depth d; w_d = Z / T_d with Z chosen so the mean weight is 1.
# Datums from r1, r1, r2 (depth 0) and c1 (depth 1): T_0 = 2, T_1 = 1, Z = 4 / (1/2+1/2+1/2+1) = 1.6.

# %%
w = depth_weights([0, 0, 0, 1], ["r1", "r1", "r2", "c1"])
print("depth weights", w)
assert all(close(a, e) for a, e in zip(w, [0.8, 0.8, 0.8, 1.6])) and close(sum(w) / 4, 1.0)

# %% [markdown]
# ## CISPO on a 3-datum batch
#     L = -(1/|M|) sum_{t in M} sg(clip(rho_t, 0, 5)) * w * A * log pi(y_t),   rho_t = exp(logp_t - logp_b,t)
# Three datums padded to 3 tokens; datum 2 has one padding token (mask 0) and datum 1 a token whose ratio
# e^4 = 54.6 is clipped to 5.

# %%
logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -1.5, -3.0], [-0.7, -0.1, 0.0]])  # [3, 3] current policy
behav = torch.tensor([[-1.1, -2.0, -0.4], [-4.2, -1.5, -3.2], [-0.7, -0.3, 0.0]])  # [3, 3] sampler's
adv = torch.tensor([0.5, -1.0, 0.25])  # [3]
mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # [3, 3]
wts = torch.tensor([0.8, 0.8, 1.6])  # [3] depth weights

# by hand, token by token
total, n_tok, grad_hand = 0.0, 0, torch.zeros(3, 3)
for i in range(3):
    for t in range(3):
        if mask[i, t]:
            rho = math.exp(float(logp[i, t] - behav[i, t]))
            c = min(rho, 5.0)
            total += -c * float(wts[i] * adv[i]) * float(logp[i, t])
            grad_hand[i, t] = -c * float(wts[i] * adv[i])
            n_tok += 1
loss_hand, grad_hand = total / n_tok, grad_hand / n_tok

x = logp.clone().requires_grad_(True)
loss, metrics = cispo_loss(x, behav, adv, mask, weights=wts)
loss.backward()
print(
    f"CISPO by hand {loss_hand:.6f} | library {loss.item():.6f} | clip_frac {metrics['loss/clip_frac']:.3f}"
)
print("d loss / d logp (library):", x.grad)
assert abs(loss.item() - loss_hand) < 1e-6
assert torch.allclose(x.grad, grad_hand, atol=1e-7)
assert metrics["loss/tokens"] == 8 and abs(metrics["loss/clip_frac"] - 1 / 8) < 1e-9
print(f"TUTORIAL03 cispo_loss {loss.item():.6f} by_hand {loss_hand:.6f}")

# %% [markdown]
# ## GPU notes
# These functions are the same on every machine: the rewards are plain Python (no device), and the loss
# runs on whatever device `logp` lives on. On a GPU the trainers compute `logp` in bf16 models with fp32
# log-softmax (`token_logprobs` upcasts) and fp32 master weights (`common/run/optim.py`); the math here
# does not change. Speed of the whole loss+backward: bench/RESULTS.md, "Level 0 vs level 1".
