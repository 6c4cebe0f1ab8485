"""Recorded trees -> the datums of one training stage, plus the fixed batch metrics (SPEC.md §4).

This is the glue between the runtime's :class:`~common.agent.tree.Tree` and the pure reward/datum
functions of this package. Every tier calls :func:`build_stage_batch` and :func:`tree_metrics`, so the
datums and the metric names are the same everywhere.

Input: ``groups`` = one list of trees per task (its root rollouts). Output: a :class:`StageBatch`.

* ``execution``: node reward r = R (root) or the child's reward (rubric score s for SERA presets, binary
  success for RAO presets: the programmatic check, or the ``--judge`` verdict when the runtime recorded
  one, ``tree.meta["judged_children"]``);
  advantage = r - b_i with b_i the LOO mean of the group's ROOT rewards. Children whose rubric, score or
  judge verdict failed contribute no datums. TextCraft: a successful agent's steps whose cell failed give
  no datum (:mod:`common.rl.filters`, the public ``filter_errors``).
* ``delegation``: every launch point (a step whose reply has a launch statement, or that launched
  children) gets leaf credit R x |leaves under its event| / |leaves|; LOO over ALL rollouts' mean launch
  rewards (a rollout without launches counts as 0); only the launch-statement tokens are trained. All the
  launches of one agent are ONE trajectory for the depth weights (``T_d`` = distinct delegating agents).
* ``rubric``: every counterfactual group (K branches with verified labels and scores under one frozen
  rubric) gives R = -L_rank when mixed (a branch whose judge verdict failed is left out); LOO over the
  mixed groups of the task; only the rubric-generation tokens are trained. Scoring tokens are never
  trained.

Zero variance (public rule): a task group whose datums' advantages are all equal carries no signal.
``zero_variance="drop"`` (TextCraft) drops its datums in the Execution and Delegation stages; ``"keep"``
(TextWorld) keeps them as they are. The Rubric stage always keeps them (the public trainer builds that
stage with ``filter_zero_variance_groups=False``): their tokens count in the token-mean. :func:`group_has_signal`
answers the no-signal question for one group before a trainer accepts it.

Fewer than 2 rollouts (public ``three_stage_train/workflow.py``: ``len(raw_rollouts) < 2`` -> no datums):
a task group of one rollout gives no Delegation and no Rubric datums (counted in ``single_rollout_groups``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from common.agent.tree import Node, Tree
from common.rl.datums import Datum, delegation_datum, execution_datums, rubric_datum
from common.rl.filters import drops_step, env_filters_error_steps
from common.rl.rewards import (
    delegation_advantages,
    execution_advantages,
    is_zero_variance,
    launch_rewards,
    leaves_under_events,
    node_reward,
    ranking_reward,
    rubric_advantages,
)
from common.rl.spans import reply_launch_spans
from common.rl.weights import cap_weights, depth_weights

METRIC_NAMES = (
    "reward/root_success",
    "reward/exec_mean",
    "rubric/pair_accuracy",
    "rubric/parse_fail_rate",
    "delegation/leaf_reward_mean",
    "tree/depth_mean",
    "tree/nodes_mean",
)
"""Fixed metric names every tier logs (plus ``loss/cispo``, ``grad_norm``, ``tokens_per_s``, ``stage``)."""


@dataclass
class StageBatch:
    """The datums of one optimizer step and what was dropped on the way."""

    stage: str
    datums: list[Datum] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    """Depth weights, one per datum (mean 1)."""
    zero_variance_groups: list[int] = field(default_factory=list)
    """Indices of task groups whose datums' advantages were all equal (no signal)."""
    counts: dict[str, int] = field(default_factory=dict)
    """Dropped/unaligned/no-signal counters for the log."""

    @property
    def num_trained_tokens(self) -> int:
        """|M|, the token-mean's denominator: the trained tokens of EVERY datum of the step."""
        return sum(d.num_trained_tokens for d in self.datums)

    @property
    def num_trainable_datums(self) -> int:
        """Datums with a trained token (advantage 0 included: such a datum still counts in |M|), the count
        the public trainer compares with its data-parallel rank count."""
        return sum(1 for d in self.datums if d.num_trained_tokens)

    def takes_step(self, min_trainable_datums: int = 1) -> bool:
        """Does this batch make an optimizer step? Only with at least ``min_trainable_datums`` datums that have
        a trained token (public ``safety/sync_decision.py: decide_sync_action``: fewer trainable datums than
        the 8 data-parallel ranks skips the step, the policy version stays and the stage repeats). 1 = any
        trained token. Every tier asks this; a round that does not step is logged ``train/skipped = 1``.

        >>> from common.rl.datums import CallTokens, rubric_datum
        >>> d = rubric_datum(CallTokens("rubric", [1], [2, 3], [-0.1, -0.1]), 0.0, 0, "r")
        >>> batch = StageBatch("rubric", [d] * 3, [1.0] * 3)
        >>> batch.takes_step(1), batch.takes_step(3), batch.takes_step(8), StageBatch("rubric").takes_step(1)
        (True, True, False, False)
        """
        if min_trainable_datums < 1:
            raise ValueError(f"min_trainable_datums must be >= 1, got {min_trainable_datums}")
        return self.num_trainable_datums >= min_trainable_datums

    def with_gradient(self) -> tuple[list[Datum], list[float]]:
        """The datums (and their depth weights) whose loss has a gradient: a trained token and
        ``advantage x weight != 0``. Every CISPO term of any other datum is multiplied by ``A x w_d = 0``,
        so its gradient is exactly zero and every trainer skips its forward and backward pass; its tokens
        still count in |M| (:attr:`num_trained_tokens`), so the step is the same. From a warm start most
        Execution datums are such: the roots and unscored children of a group whose roots all failed
        (35 of 37 datums in a measured SmolLM2 round, 95 % of its training tokens)."""
        keep = [
            i
            for i, (d, w) in enumerate(zip(self.datums, self.weights, strict=True))
            if d.num_trained_tokens and d.advantage * w != 0
        ]
        return [self.datums[i] for i in keep], [self.weights[i] for i in keep]


def _child_reward(node: Node, execution_reward: str, judge_labels: bool = False) -> float | None:
    if execution_reward == "binary":
        if judge_labels:  # the --judge verdict the runtime stored; None = unparseable: drop the child
            return None if node.branch_label is None else float(node.branch_label)
        return 1.0 if node.success else 0.0
    if node.rubric is None or node.score is None:
        return None  # rubric or score failed to parse: the child's tokens are dropped
    return float(node.score)


def _judged(tree: Tree, judge_labels: bool) -> bool:
    """RAO child rewards from ``--judge`` verdicts: asked for, or recorded by the runtime in the tree."""
    return judge_labels or bool(tree.meta.get("judged_children", False))


def _traj(g: int, i: int, node_id: str) -> str:
    return f"{g}/{i}/{node_id}"


def _add_group(batch: StageBatch, g: int, datums: list[Datum], zero_variance: str) -> None:
    """Append one task group's datums, applying the zero-variance rule to ALL of them."""
    if zero_variance not in ("drop", "keep"):
        raise ValueError(f"zero_variance must be 'drop' or 'keep', got {zero_variance!r}")
    if is_zero_variance(d.advantage for d in datums):
        batch.zero_variance_groups.append(g)
        if zero_variance == "drop":
            return
    batch.datums += datums


def _filter_success(node: Node, root_reward: float, reward: float, execution_reward: str) -> float:
    """The public ``filter_success`` of one agent (:mod:`common.rl.filters`): R for the root, the scorer's
    success verdict for a SERA child (``reward/filter_success = float(rubric_success)``), the binary reward
    for a RAO child."""
    if node.parent_id is None:
        return root_reward
    if execution_reward == "binary":
        return reward
    return 1.0 if node.score_success else 0.0


def execution_batch(
    groups: Sequence[Sequence[Tree]],
    execution_reward: str,
    zero_variance: str,
    judge_labels: bool = False,
    filter_errors: bool | None = None,
) -> StageBatch:
    batch = StageBatch("execution", counts={"dropped_children": 0, "error_steps_dropped": 0})
    for g, trees in enumerate(groups):
        roots = [1.0 if t.success else 0.0 for t in trees]
        nodes = [[n for n in t.committed_nodes()] for t in trees]
        rewards = [
            [
                node_reward(
                    n.parent_id is None,
                    R,
                    None
                    if n.parent_id is None
                    else _child_reward(n, execution_reward, _judged(t, judge_labels)),
                )
                for n in ns
            ]
            for t, ns, R in zip(trees, nodes, roots, strict=True)
        ]
        advantages, _ = execution_advantages(roots, rewards)
        datums: list[Datum] = []
        for i, (t, ns, advs, rs) in enumerate(zip(trees, nodes, advantages, rewards, strict=True)):
            filtering = env_filters_error_steps(t.env) if filter_errors is None else filter_errors
            for n, a, r in zip(ns, advs, rs, strict=True):
                if a is None:
                    batch.counts["dropped_children"] += 1
                    continue
                steps = [s for s in n.steps if s.call.output_ids]
                if filtering:  # TextCraft: a successful agent's failed cells give no datum (public rule)
                    success = _filter_success(n, roots[i], float(r or 0.0), execution_reward)
                    kept = [s for s in steps if not drops_step(s, success)]
                    batch.counts["error_steps_dropped"] += len(steps) - len(kept)
                    steps = kept
                calls = [s.call for s in steps]
                datums += execution_datums(calls, a, n.depth, _traj(g, i, n.node_id))
        _add_group(batch, g, datums, zero_variance)
    return batch


def launch_points(tree: Tree) -> list[tuple[Node, Any, tuple[str, int]]]:
    """``(node, step, (node_id, step index))`` for every step that launched or wrote a launch statement."""
    out = []
    for n in tree.committed_nodes():
        for s in n.steps:
            if s.launched or s.refused_launches or reply_launch_spans(s.call.text):
                out.append((n, s, (n.node_id, s.index)))
    return out


def delegation_batch(
    groups: Sequence[Sequence[Tree]], tokenizer: Any, zero_variance: str = "keep"
) -> StageBatch:
    batch = StageBatch(
        "delegation", counts={"unaligned": 0, "no_launch": 0, "launches": 0, "single_rollout_groups": 0}
    )
    for g, trees in enumerate(groups):
        if len(trees) < 2:  # public: no datums below 2 root rollouts
            batch.counts["single_rollout_groups"] += 1
            continue
        datums: list[Datum] = []
        points = [launch_points(t) for t in trees]
        rewards = [
            launch_rewards(1.0 if t.success else 0.0, [p[2] for p in pts], t.committed_nodes())
            for t, pts in zip(trees, points, strict=True)
        ]
        advantages = delegation_advantages(rewards)
        for i, (pts, advs) in enumerate(zip(points, advantages, strict=True)):
            started: set[str] = set()
            for (node, step, _), a in zip(pts, advs, strict=True):
                batch.counts["launches"] += 1
                if not step.call.output_ids:
                    continue
                # one trajectory per delegating agent (not per launch): T_d counts delegating agents
                traj = _traj(g, i, node.node_id)
                r = delegation_datum(
                    step.call, a, node.depth, traj, tokenizer=tokenizer, traj_start=traj not in started
                )
                if r.datum is None:
                    batch.counts[r.status] += 1
                else:
                    started.add(traj)
                    datums.append(r.datum)
        _add_group(batch, g, datums, zero_variance)
    return batch


def counterfactual_groups(tree: Tree) -> dict[str, list[Node]]:
    """``group id -> branch nodes ordered by branch index`` for every counterfactual group of a tree."""
    groups: dict[str, list[Node]] = {}
    for n in tree.nodes.values():
        if n.branch_group is not None and n.branch_group.startswith("g"):
            groups.setdefault(n.branch_group, []).append(n)
    return {k: sorted(v, key=lambda n: n.branch_index or 0) for k, v in groups.items()}


def rubric_batch(groups: Sequence[Sequence[Tree]]) -> StageBatch:
    """Rubric-stage datums. A zero-variance task is always kept (public ``filter_zero_variance_groups=False``
    for this stage, both environments); a task of one rollout gives none."""
    batch = StageBatch(
        "rubric",
        counts={
            "groups": 0,
            "mixed_groups": 0,
            "rubric_parse_fail": 0,
            "unjudged_branches": 0,
            "single_rollout_groups": 0,
        },
    )
    for g, trees in enumerate(groups):
        if len(trees) < 2:  # public: no datums below 2 root rollouts
            batch.counts["single_rollout_groups"] += 1
            continue
        entries = []  # (branch-0 node, reward or None) over all groups of all rollouts of this task
        for t in trees:
            for branches in counterfactual_groups(t).values():
                batch.counts["groups"] += 1
                head = branches[0]
                if head.rubric is None:
                    batch.counts["rubric_parse_fail"] += 1
                    continue
                # an unparseable judge verdict (label None) drops that branch, never counts as a failure
                judged = [b for b in branches if b.branch_label is not None]
                batch.counts["unjudged_branches"] += len(branches) - len(judged)
                reward = ranking_reward([b.score for b in judged], [bool(b.branch_label) for b in judged])
                batch.counts["mixed_groups"] += int(reward is not None)
                entries.append((t, head, reward))
        advantages = rubric_advantages([r for _, _, r in entries])
        datums: list[Datum] = []
        for k, ((_t, head, _), a) in enumerate(zip(entries, advantages, strict=True)):
            if a is None or head.rubric_call is None or not head.rubric_call.output_ids:
                continue
            datums.append(rubric_datum(head.rubric_call, a, head.depth - 1, f"{g}/rubric{k}/{head.node_id}"))
        _add_group(batch, g, datums, "keep")  # public: the Rubric stage never filters zero variance
    return batch


def build_stage_batch(
    stage: str,
    groups: Sequence[Sequence[Tree]],
    execution_reward: str = "rubric",
    zero_variance: str = "drop",
    tokenizer: Any = None,
    judge_labels: bool = False,
    filter_errors: bool | None = None,
    depth_weight_cap: float = 0.0,
) -> StageBatch:
    """The datums of ``stage`` for one optimizer step, with depth weights over the whole batch.

    ``zero_variance``: ``"drop"`` (TextCraft, public ``filter_zero_variance_groups=true``) or ``"keep"``
    (TextWorld) for task groups whose datums' advantages are all equal, in the Execution and Delegation
    stages; the Rubric stage always keeps them (public ``filter_zero_variance_groups=False`` there).
    ``judge_labels``: RAO child rewards come from the ``--judge`` verdicts stored in ``branch_label``
    (the runtime sets ``tree.meta["judged_children"]`` when it judged them, so trainers need not pass it).
    ``filter_errors``: the Execution stage leaves out the failed cells of successful agents
    (:mod:`common.rl.filters`, counted in ``counts["error_steps_dropped"]``) before the zero-variance test;
    None (every tier) = each tree's environment decides (:attr:`common.envs.EnvSpec.filter_error_steps`:
    TextCraft only), True / False force it. ``depth_weight_cap``: ``--depth-weight-cap`` (0: the paper's
    weights as they are; :func:`common.rl.weights.cap_weights`).
    """
    if stage == "execution":
        batch = execution_batch(groups, execution_reward, zero_variance, judge_labels, filter_errors)
    elif stage == "delegation":
        batch = delegation_batch(groups, tokenizer, zero_variance)
    elif stage == "rubric":
        batch = rubric_batch(groups)
    else:
        raise ValueError(f"unknown stage {stage!r}; expected execution, delegation or rubric")
    batch.weights = depth_weights([d.depth for d in batch.datums], [d.trajectory_id for d in batch.datums])
    batch.weights = cap_weights(batch.weights, depth_weight_cap)  # 0: unchanged (the paper)
    batch.counts["zero_gradient_datums"] = len(batch.datums) - len(batch.with_gradient()[0])  # not computed
    return batch


def group_has_signal(
    trees: Sequence[Tree],
    stage: str,
    execution_reward: str = "rubric",
    tokenizer: Any = None,
    judge_labels: bool = False,
) -> bool:
    """Does one task's rollout group carry signal for ``stage``? The zero-variance rule of
    :func:`build_stage_batch` on ALL the group's datums (not only the root rewards): False when their
    advantages are all equal or there is none. Trainers call it to replace a task (TextCraft) instead of
    testing the root rewards alone. The delegation stage needs ``tokenizer`` (launch spans -> tokens)
    unless the calls carry token offsets.

    >>> group_has_signal([], "execution")   # no rollouts, no signal
    False
    """
    if not trees:
        return False
    batch = build_stage_batch(stage, [list(trees)], execution_reward, "drop", tokenizer, judge_labels)
    return bool(batch.datums) and not batch.zero_variance_groups


def tree_metrics(
    trees: Sequence[Tree], execution_reward: str = "rubric", judge_labels: bool = False
) -> dict[str, float]:
    """The fixed batch metrics (:data:`METRIC_NAMES`) of a list of trees."""
    n = max(1, len(trees))
    exec_rewards, pairs_ok, pairs, children, fails, leaf = [], 0, 0, 0, 0, []
    for t in trees:
        committed = t.committed_nodes()
        R = 1.0 if t.success else 0.0
        for node in committed:
            r = (
                R
                if node.parent_id is None
                else _child_reward(node, execution_reward, _judged(t, judge_labels))
            )
            if r is not None:
                exec_rewards.append(r)
        for node in t.nodes.values():
            if node.parent_id is not None and (node.branch_index in (None, 0)):
                children += 1
                fails += int(node.rubric_error is not None or node.score_error is not None)
        for branches in counterfactual_groups(t).values():
            pos = [b.score for b in branches if b.branch_label and b.score is not None]
            neg = [b.score for b in branches if b.branch_label is False and b.score is not None]
            pairs += len(pos) * len(neg)
            pairs_ok += sum(si > sj for si in pos for sj in neg)
        pts = launch_points(t)
        if pts:
            events, total = leaves_under_events(committed)
            leaf += launch_rewards(R, [p[2] for p in pts], committed) if total else []
    return {
        "reward/root_success": sum(t.success for t in trees) / n,
        "reward/exec_mean": sum(exec_rewards) / len(exec_rewards) if exec_rewards else 0.0,
        "rubric/pair_accuracy": pairs_ok / pairs if pairs else float("nan"),
        "rubric/parse_fail_rate": fails / children if children else 0.0,
        "delegation/leaf_reward_mean": sum(leaf) / len(leaf) if leaf else 0.0,
        "tree/depth_mean": sum(t.depth_max() for t in trees) / n,
        "tree/nodes_mean": sum(len(t.committed_nodes()) for t in trees) / n,
    }
