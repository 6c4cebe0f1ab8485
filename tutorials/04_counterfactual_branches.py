# %% [markdown]
# # Tutorial 4 — counterfactual branches: a mixed group, ranking pairs and the hinge loss
#
# The Rubric stage trains the rubric WRITER. At a delegation the runtime snapshots the live world and runs
# K copies of the same child on isolated forks, all under ONE frozen rubric; each branch gets a verified
# label (did the child really reach its goal?) and a rubric score s. A good rubric scores the successes
# above the failures. The signal exists only in a *mixed* group (some branches succeed, some fail).
#
# The scripted oracle always succeeds, so here a small wrapper makes the children of branches 2 and 3 give
# up at once (they fail), and plays a miscalibrated scorer (fixed scores per branch), so the hinge is not
# zero. Everything is then checked against `common/rl`: `ranking_loss`, `rubric_advantages`, the
# `rubric/pair_accuracy` metric and the datums `build_stage_batch("rubric", ...)` makes.
#
#     python tutorials/04_counterfactual_branches.py     # ~20 s

# %%
import asyncio
import json

from common.agent.runtime import RuntimeConfig, run_root
from common.agent.tree import Tree
from common.envs import make_env
from common.envs.textcraft.tasks import generate_tasks
from common.policy import make_policy
from common.policy.base import Completion, GenerationRequest, Policy
from common.policy.forced import TeacherForcedPolicy
from common.policy.hf import HFPolicy
from common.rl import ranking_loss, rubric_advantages
from common.rl.batch import build_stage_batch, counterfactual_groups, tree_metrics

K = 4
SCORES = {  # (group, branch) -> the scorer's final_score; the scorer cannot see the true outcome
    "g1": [0.9, 0.5, 0.3, 0.6],  # branches 2 and 3 fail, but 3 is scored above success 1: one bad pair
    "g2": [0.8, 0.7, 0.1, 0.2],  # every success at least 0.5 above every failure: hinge 0
    "g3": [0.4, 0.3, 0.35, 0.1],  # successes barely above or below failures
}


def branch_of(node_id: str) -> int:
    """Branch node ids look like ``0.7~b2`` (branch 2); the live branch 0 has no suffix."""
    return int(node_id.rsplit("~b", 1)[1]) if "~b" in node_id else 0


def group_of(node_id: str) -> str:
    """Children of the root are numbered 0.1, 0.2, ... in launch order: K per delegation."""
    n = int(node_id.split("~")[0].split(".")[1])
    return f"g{(n - 1) // K + 1}"


class MixedBranches(Policy):
    """The delegating oracle, except: children on branches >= 2 give up; the scorer uses SCORES."""

    def __init__(self):
        self.oracle = make_policy("oracle-delegate", env="textcraft")

    async def generate(self, request: GenerationRequest) -> Completion:
        node_id = str(request.meta.get("node_id", "0"))
        if request.role == "act" and request.meta.get("depth", 0) >= 1 and branch_of(node_id) >= 2:
            return Completion(text='<python>finish("I give up.")</python>', finish_reason="scripted")
        if request.role == "score":
            group = group_of(node_id)
            return Completion(text=json.dumps({"success": True, "criterion_scores": [1, 1, 1, 1],
                                               "final_score": SCORES[group][branch_of(node_id)],
                                               "reason": "looks done"}), finish_reason="scripted")  # fmt: skip
        return await self.oracle.generate(request)


# %% [markdown]
# ## The rollout
# `TeacherForcedPolicy` (what level 0's `--oracle-mix` uses) tokenises every scripted reply and records the
# random-init `tiny` model's log-probs of those tokens, so the completions are token-exact and the
# Rubric-stage datums can be built at the end.

# %%
task = generate_tasks(split="train", n=1, seed=4, difficulty="hard")[0]  # tutorial 2's task: 3 delegations
policy = TeacherForcedPolicy(HFPolicy("tiny", dtype="float32"), MixedBranches(), oracle_mix=1.0)
cfg = RuntimeConfig(counterfactual_k=K, temperature=0.0)
# the fixed-order CodeAct worker: each agent's cells run in an isolated process, served one segment at a time
# on the event loop, so the K branches act in one fixed order and the numbers below repeat in every run
tree = asyncio.run(run_root(task, make_env("textcraft", executor="worker-ordered"), policy, cfg))
groups = counterfactual_groups(tree)
for g, branches in groups.items():
    print(g, [(b.node_id, b.branch_index, "live" if b.committed else "fork", b.branch_label, b.score)
              for b in branches])  # fmt: skip
print("root success", tree.success)
assert sorted(groups) == ["g1", "g2", "g3"] and all(len(b) == K for b in groups.values())
assert all([b.branch_label for b in branches] == [True, True, False, False] for branches in groups.values())
assert tree.success  # the failing branches were forks: the live tree went on with branch 0
assert all([b.score for b in groups[g]] == SCORES[g] for g in groups)

# %% [markdown]
# ## Ranking pairs and the hinge, by hand
# Each group has 2 successes x 2 failures = 4 pairs; a pair (i success, j failure) costs
# max(0, 0.2 - (s_i - s_j)). L_g is the mean over the pairs, the group reward R_g = -L_g, and the
# advantage of group g is R_g minus the mean of the OTHER groups' rewards of the task (LOO).

# %%
L_hand, correct, n_pairs = {}, 0, 0
for g, branches in groups.items():
    pos = [b.score for b in branches if b.branch_label]
    neg = [b.score for b in branches if not b.branch_label]
    hinges = [max(0.0, 0.2 - (si - sj)) for si in pos for sj in neg]
    correct += sum(si > sj for si in pos for sj in neg)
    n_pairs += len(hinges)
    L_hand[g] = sum(hinges) / len(hinges)
    L_lib = ranking_loss([b.score for b in branches], [b.branch_label for b in branches])
    print(g, "pairs", [(si, sj) for si in pos for sj in neg], "hinges", [round(h, 3) for h in hinges],
          f"L by hand {L_hand[g]:.4f} library {L_lib:.4f}")  # fmt: skip
    assert abs(L_lib - L_hand[g]) < 1e-12
R = [-L_hand[g] for g in sorted(groups)]
adv_hand = [R[k] - sum(R[:k] + R[k + 1 :]) / (len(R) - 1) for k in range(len(R))]
adv_lib = rubric_advantages(R)
print("group rewards", [round(r, 4) for r in R], "| LOO advantages by hand", [round(a, 4) for a in adv_hand])
assert all(abs(a - b) < 1e-12 for a, b in zip(adv_hand, adv_lib, strict=True))
assert abs(L_hand["g1"] - 0.075) < 1e-12 and L_hand["g2"] == 0.0  # tutorial 3's numbers; a perfect ranking

# %% [markdown]
# ## What the trainer gets
# `build_stage_batch("rubric", [[tree, other]])` turns each mixed group into ONE datum: the rubric-writing
# call of the group (the parent's rubric tokens, never the scoring tokens), with the group's advantage.
# A task needs 2 rollouts to train at all (the public workflow returns nothing below 2); the second one
# here delegated nothing, so it adds no group and the LOO stays over this tree's 3 groups.
# `rubric/pair_accuracy` is the share of pairs ranked the right way round.

# %%
other = Tree(task_id=tree.task_id, env=tree.env)  # a rollout without counterfactual groups
batch = build_stage_batch("rubric", [[tree, other]], zero_variance="keep")
print("datums", len(batch.datums), "advantages", [round(d.advantage, 4) for d in batch.datums], batch.counts)
acc = tree_metrics([tree])["rubric/pair_accuracy"]
print(f"pair accuracy {acc:.4f} = {correct}/{n_pairs}")
assert sorted(round(d.advantage, 12) for d in batch.datums) == sorted(round(a, 12) for a in adv_hand)
assert all(d.stage == "rubric" and d.num_trained_tokens > 0 for d in batch.datums)
assert abs(acc - correct / n_pairs) < 1e-12
print(f"TUTORIAL04 L_rank g1 {L_hand['g1']:.4f} g2 {L_hand['g2']:.4f} g3 {L_hand['g3']:.4f} pair_accuracy {acc:.4f}")

# %% [markdown]
# ## GPU notes
# In training, counterfactual branches run only in Rubric-stage rollouts (`--counterfactual-k`, paper 8;
# laptop default 4) and cost K-1 extra child rollouts per delegation, capped by `max_envs_per_rollout`.
# Forks are cheap on both environments (bench/RESULTS.md, "TextCraft-Synth": 0.23 µs; "TextWorld-Sync vs
# real TextWorld": 1.22 µs vs 264 ms for real TextWorld's `env.copy()`), so the cost is generation: on a
# GPU the branches' calls are batched together by the level-1 engine or the level-2 servers.
