"""Mutation check of the RL math: do the tests catch a wrong rule? Prints the kill rate.

    python bench/bench_mutation.py                 # every mutant (~15-25 min on 2 CPU cores)
    python bench/bench_mutation.py --only batch    # mutants whose name contains "batch"
    python bench/bench_mutation.py --list          # the mutants, without running anything

Each mutant is a hand-written, plausible mistake in ``common/rl/*.py``, ``common/agent/judge.py`` or a
tier's loss path (level 0 ``accumulate_gradients`` / ``datum_logprobs``, level 1
``accumulate_gradients_packed`` / ``packed_logprobs`` in ``level1_batched/packing.py``): one exact text replacement. For each mutant the
script copies the repository's source folders into a temporary directory, applies the replacement there
(the shared checkout is never touched), and runs the tests that concern that file with ``pytest -x``.
A mutant is KILLED when some test fails, SURVIVED when all pass. A replacement that no longer matches the
source is reported as STALE (fix the mutant after refactoring; it counts as a failure of this check).

What it simplifies: a curated list instead of a mutation tool (mutmut and friends generate hundreds of
mostly trivial mutants and need ~1 test run each; on 2 cores that is hours). The list targets the rules
that an audit found easy to get wrong, including the four of issue #11 (uniform depth weights in the
batch builder, rubric LOO across the batch, datums for homogeneous groups, the delegation T_d).
Results are recorded in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPY = ("common", "level0_single_process", "level1_batched", "tests", "pyproject.toml", "conftest.py")

T = "tests/test_rl_"
TESTS_OF = {  # the tests that concern each file (a mutant runs these, stopping at the first failure)
    "common/rl/rewards.py": [T + "rewards.py", T + "batch.py", T + "doctests.py"],
    "common/rl/weights.py": [T + "weights.py", T + "batch.py", T + "doctests.py"],
    "common/rl/loss.py": [
        T + "loss.py",
        T + "doctests.py",
        "tests/test_level0.py::test_fixture_loss_and_grad_norm_match_golden",
    ],
    "common/rl/batch.py": [T + "batch.py", T + "judge.py", T + "doctests.py"],
    "common/rl/spans.py": [T + "spans.py", T + "datums.py", T + "batch.py", T + "doctests.py"],
    "common/rl/datums.py": [T + "datums.py", T + "batch.py", T + "doctests.py"],
    "common/rl/schedule.py": [T + "schedule.py", T + "doctests.py"],
    "common/agent/judge.py": [T + "judge.py"],
}
OFF_POLICY = "tests/test_rl_offpolicy_parity.py"
LEVEL0_FIXTURE = ["tests/test_level0.py::test_fixture_loss_and_grad_norm_match_golden", OFF_POLICY]
LEVEL1_FIXTURE = ["tests/test_level1.py::test_packed_matches_level0", OFF_POLICY]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    """Test files / node ids run for this mutant (the ones that concern ``path``)."""


def M(name: str, path: str, old: str, new: str, tests: list[str] | None = None) -> Mutant:
    return Mutant(name, path, old, new, tuple(tests or TESTS_OF[path]))


R, W, L, B = "common/rl/rewards.py", "common/rl/weights.py", "common/rl/loss.py", "common/rl/batch.py"
S, D, SC, J = "common/rl/spans.py", "common/rl/datums.py", "common/rl/schedule.py", "common/agent/judge.py"
L0, L1 = "level0_single_process/train.py", "level1_batched/packing.py"

# A whole-function mutant (``old`` = "def NAME" replaces that function): the rubric LOO taken over the
# mixed groups of ALL tasks of the batch instead of per task.
RUBRIC_BATCH_LOO = """def rubric_batch(groups, zero_variance="keep"):
    batch = StageBatch("rubric", counts={"groups": 0, "mixed_groups": 0, "rubric_parse_fail": 0, "unjudged_branches": 0})
    entries = []
    for g, trees in enumerate(groups):
        for t in trees:
            for branches in counterfactual_groups(t).values():
                batch.counts["groups"] += 1
                head = branches[0]
                if head.rubric is None:
                    batch.counts["rubric_parse_fail"] += 1
                    continue
                judged = [b for b in branches if b.branch_label is not None]
                batch.counts["unjudged_branches"] += len(branches) - len(judged)
                reward = ranking_reward([b.score for b in judged], [bool(b.branch_label) for b in judged])
                batch.counts["mixed_groups"] += int(reward is not None)
                entries.append((g, head, reward))
    advantages = rubric_advantages([r for _, _, r in entries])
    per_task = {}
    for k, ((g, head, _), a) in enumerate(zip(entries, advantages)):
        if a is None or head.rubric_call is None or not head.rubric_call.output_ids:
            continue
        per_task.setdefault(g, []).append(rubric_datum(head.rubric_call, a, head.depth - 1, f"{g}/rubric{k}/{head.node_id}"))
    for g in range(len(groups)):
        _add_group(batch, g, per_task.get(g, []), zero_variance)
    return batch
"""

MUTANTS = [
    # ---- rewards.py
    M(
        "rewards: mean baseline instead of LOO",
        R,
        "return [(total - v) / (n - 1) for v in values]",
        "return [total / n for v in values]",
    ),
    M(
        "rewards: a group of one gets baseline 0",
        R,
        "        return [float(values[0])]",
        "        return [0.0]",
    ),
    M(
        "rewards: zero variance never flagged",
        R,
        "    return not kept or _all_equal(kept)",
        "    return not kept",
    ),
    M(
        "rewards: zero variance from the roots only",
        R,
        "    flat = is_zero_variance(a for nodes in out for a in nodes)",
        "    flat = group.roots_equal",
    ),
    M(
        "rewards: leaf credit without the leaf fraction",
        R,
        "    return float(root_R) * leaves_under_event / total_leaves",
        "    return float(root_R)",
    ),
    M(
        "rewards: leaves counted as direct children",
        R,
        "1 if not kids else sum(leaves[c.node_id] for c in kids)",
        "1 if not kids else len(kids)",
    ),
    M(
        "rewards: refused launch gets the root reward",
        R,
        "if p in events else 0.0 for p in launch_points]",
        "if p in events else float(root_R) for p in launch_points]",
    ),
    M(
        "rewards: delegation baseline over launching rollouts only",
        R,
        "    means = [math.fsum(r) / len(r) if r else 0.0 for r in rollout_launch_rewards]\n    baselines = loo_baseline(means) if means else []",
        "    means = [math.fsum(r) / len(r) if r else 0.0 for r in rollout_launch_rewards]\n"
        "    live = iter(loo_baseline([m for m, r in zip(means, rollout_launch_rewards) if r]))\n"
        "    baselines = [next(live) if r else 0.0 for r in rollout_launch_rewards]",
    ),
    M("rewards: hinge sign flipped", R, "max(0.0, margin - (si - sj))", "max(0.0, margin - (sj - si))"),
    M("rewards: unjudged branch counted as a failure", R, "if _valid(s) and y is not None]", "if _valid(s)]"),
    M(
        "rewards: ranking loss summed, not averaged over pairs",
        R,
        "for sj in neg) / (len(pos) * len(neg))",
        "for sj in neg)",
    ),
    M(
        "rewards: rubric advantages without a baseline",
        R,
        "advantages = iter(loo_advantages(valid)) if valid else iter(())",
        "advantages = iter(list(valid))",
    ),
    M(
        "rewards: mixed-group test accepts homogeneous",
        R,
        "    return any(labels) and not all(labels)",
        "    return any(labels)",
    ),
    # ---- weights.py
    M(
        "weights: uniform (no depth weighting)",
        W,
        "    inv = [1.0 / len(trajectories[d]) for d in depths]",
        "    inv = [1.0 for d in depths]",
    ),
    M("weights: no normalisation (Z = 1)", W, "    z = len(depths) / sum(inv)", "    z = 1.0"),
    M(
        "weights: T_d counts datums, not trajectories",
        W,
        "trajectories.setdefault(d, set()).add(tid)",
        "trajectories.setdefault(d, []).append(tid)",
    ),
    # ---- loss.py
    M("loss: no ratio clip", L, "    clipped = ratio.clamp(0.0, clip_max)", "    clipped = ratio"),
    M(
        "loss: gradient through the ratio",
        L,
        "ratio = torch.exp(logp.detach() - behaviour_logp",
        "ratio = torch.exp(logp - behaviour_logp",
    ),
    M(
        "loss: mean over all positions",
        L,
        "    loss = per_token.sum() / denom",
        "    loss = per_token.mean()",
    ),
    M(
        "loss: depth weights ignored",
        L,
        "advantages = advantages * weights.to(logp.dtype)[:, None]",
        "advantages = advantages",
    ),
    M(
        "loss: sign flipped",
        L,
        "torch.where(on, -clipped * advantages * logp, 0.0)",
        "torch.where(on, clipped * advantages * logp, 0.0)",
    ),
    M(
        "loss: logits, not log-probs",
        L,
        "    return picked - torch.logsumexp(logits, dim=-1)",
        "    return picked",
    ),
    M(
        "loss: clip at 1 (PPO-like)",
        L,
        "    clipped = ratio.clamp(0.0, clip_max)",
        "    clipped = ratio.clamp(0.0, 1.0)",
    ),
    # ---- batch.py (the four of issue #11 first)
    M(
        "batch: uniform depth weights in the batch builder",
        B,
        "    batch.weights = depth_weights([d.depth for d in batch.datums], [d.trajectory_id for d in batch.datums])",
        "    batch.weights = [1.0] * len(batch.datums)",
    ),
    M("batch: rubric LOO across the whole batch, not per task", B, "def rubric_batch", RUBRIC_BATCH_LOO),
    M(
        "batch: datums for homogeneous groups",
        B,
        '                batch.counts["mixed_groups"] += int(reward is not None)',
        "                reward = 0.0 if reward is None else reward\n"
        '                batch.counts["mixed_groups"] += int(reward is not None)',
    ),
    M(
        "batch: delegation T_d counts launches",
        B,
        "                traj = _traj(g, i, node.node_id)\n",
        '                traj = _traj(g, i, node.node_id) + f"/launch{step.index}"\n',
    ),
    M(
        "batch: zero-variance rule never applied",
        B,
        "    if is_zero_variance(d.advantage for d in datums):",
        "    if False:",
    ),
    M(
        "batch: drop and keep swapped",
        B,
        '        if zero_variance == "drop":\n            return',
        '        if zero_variance == "keep":\n            return',
    ),
    M(
        "batch: SERA child reward = binary success",
        B,
        "    return float(node.score)",
        "    return 1.0 if node.success else 0.0",
    ),
    M(
        "batch: failed rubric child trained at 0",
        B,
        "        return None  # rubric or score failed to parse",
        "        return 0.0  # rubric or score failed to parse",
    ),
    M(
        "batch: judge verdicts recorded by the runtime ignored",
        B,
        '    return judge_labels or bool(tree.meta.get("judged_children", False))',
        "    return judge_labels",
    ),
    M(
        "batch: rubric datum at the child's depth",
        B,
        "rubric_datum(head.rubric_call, a, head.depth - 1,",
        "rubric_datum(head.rubric_call, a, head.depth,",
    ),
    M(
        "batch: every delegation datum starts a trajectory",
        B,
        "traj_start=traj not in started",
        "traj_start=True",
    ),
    M(
        "batch: uncommitted branches trained in execution",
        B,
        "        nodes = [[n for n in t.committed_nodes()] for t in trees]",
        "        nodes = [list(t.nodes.values()) for t in trees]",
    ),
    M(
        "batch: unjudged branches kept as failures",
        B,
        "judged = [b for b in branches if b.branch_label is not None]",
        "judged = list(branches)",
    ),
    # ---- spans.py / datums.py
    M(
        "spans: first <python> in the reply (inside the thought)",
        S,
        "    code_span = parse_codeact_reply(reply).code_span",
        '    import re as _re\n    _m = _re.search(r"<python>(.*?)(?:</python\\s*>|\\Z)", reply, _re.S)\n'
        "    code_span = None if _m is None else _m.span(1)",
    ),
    M(
        "spans: touching tokens count as overlapping",
        S,
        "        if any(max(s, a) < min(e, b) for a, b in spans):\n            mask[t] = 1",
        "        if any(max(s, a) <= min(e, b) for a, b in spans):\n            mask[t] = 1",
    ),
    M(
        "spans: compound header trains the whole body",
        S,
        "    return (start, header_span[1])  # e.g.",
        "    return node_span(stmt)  # e.g.",
    ),
    M(
        "spans: delegate blocks inside <think> trained",
        S,
        "        if not any(a <= m.start() < b for a, b in thinking)",
        "        if True",
    ),
    M(
        "datums: delegation output not cut after the launch",
        D,
        "    last = max(t for t, m in enumerate(mask) if m)",
        "    last = len(mask) - 1",
    ),
    M(
        "datums: rubric calls trained as execution",
        D,
        '        if call.role != "act":\n            continue',
        '        if call.role == "score":\n            continue',
    ),
    # ---- schedule.py / judge.py
    M("schedule: off by one at a stage boundary", SC, "            if k < n:", "            if k <= n:"),
    M(
        "schedule: rao_d 16:2 (not the public 12:4)",
        SC,
        '"rao_d", "binary", "execution:12,delegation:4"',
        '"rao_d", "binary", "execution:16,delegation:2"',
    ),
    M(
        "judge: unparseable verdict = failure",
        J,
        '            return obj["success"]\n    return None',
        '            return obj["success"]\n    return False',
    ),
    # ---- the tiers' loss paths
    M(
        "level0: per-datum token mean",
        L0,
        "            num_tokens=n_tokens,\n        )  # this datum's share",
        "            num_tokens=None,\n        )  # this datum's share",
        LEVEL0_FIXTURE,
    ),
    M(
        "level0: depth weights dropped",
        L0,
        "            weights=torch.tensor([w], device=logp.device),",
        "            weights=None,",
        LEVEL0_FIXTURE,
    ),
    M(
        "level0: logits shifted by one",
        L0,
        "token_logprobs(logits[:, P - 1 : -1], ids[:, P:])",
        "token_logprobs(logits[:, P:], ids[:, P:])",
        LEVEL0_FIXTURE,
    ),
    M(
        "level0: behaviour log-probs = current (on-policy assumed)",
        L0,
        "            torch.tensor([d.behaviour_logprobs], device=logp.device),  # [1, T]",
        "            logp.detach(),  # [1, T]",
        LEVEL0_FIXTURE,
    ),
    M(
        "level1: per-micro-batch token mean",
        L1,
        "            num_tokens=n_tokens,\n        )  # this micro-batch's share",
        "            num_tokens=None,\n        )  # this micro-batch's share",
        LEVEL1_FIXTURE,
    ),
    M(
        "level1: depth weights dropped",
        L1,
        "            weights=torch.tensor([weights[i] for i in idx], device=logp.device),  # [D]",
        "            weights=None,",
        LEVEL1_FIXTURE,
    ),
    M(
        "level1: packed datums attend to each other",
        L1,
        "        position_ids=torch.tensor([pos], device=dev),  # [1, N]\n",
        "",
        LEVEL1_FIXTURE,
    ),
    M(
        "level1: behaviour log-probs = current",
        L1,
        "            _grid([d.behaviour_logprobs for d in ds], width).to(logp.device),  # [D, T_max]",
        "            logp.detach(),  # [D, T_max]",
        LEVEL1_FIXTURE,
    ),
]


def prepare(tmp: Path) -> None:
    for name in COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, tmp / name, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
        elif src.exists():
            shutil.copy2(src, tmp / name)


def run_one(m: Mutant, base: Path, timeout: float) -> tuple[str, float, str]:
    with tempfile.TemporaryDirectory(prefix="mutant-") as d:
        tmp = Path(d)
        shutil.copytree(base, tmp, dirs_exist_ok=True)
        target = tmp / m.path
        text = target.read_text()
        if m.old.startswith("def ") and "\n" not in m.old:  # replace a whole top-level function
            lines = text.splitlines(keepends=True)
            node = next((n for n in ast.parse(text).body if getattr(n, "name", None) == m.old[4:]), None)
            if node is None:
                return "STALE", 0.0, f"no function {m.old[4:]} in {m.path}"
            start = node.lineno - 1 - len(node.decorator_list)
            target.write_text("".join(lines[:start]) + m.new + "".join(lines[node.end_lineno :]))
        elif text.count(m.old) != 1:
            return "STALE", 0.0, f"the replacement matches {text.count(m.old)} times in {m.path}"
        else:
            target.write_text(text.replace(m.old, m.new))
        env = {**os.environ, "PYTHONPATH": str(tmp), "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-o",
            "addopts=",
            "-x",
            "-q",
            "-rfE",
            "-p",
            "no:cacheprovider",
            "--no-header",
            *m.tests,
        ]
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "KILLED", time.perf_counter() - t0, "timeout"
        dt = time.perf_counter() - t0
        if p.returncode == 0:
            return "SURVIVED", dt, ""
        failed = [ln for ln in p.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        last = p.stdout.strip().splitlines()[-1:] or [""]
        return "KILLED", dt, (failed or last)[0][:150]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run the mutants whose name contains this text")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant's test run")
    args = ap.parse_args()
    chosen = [m for m in MUTANTS if args.only in m.name]
    if args.list:
        for m in chosen:
            print(f"{m.name:60s} {m.path}")
        return
    with tempfile.TemporaryDirectory(prefix="mutation-base-") as b:
        base = Path(b)
        prepare(base)
        # the tests must import the copy, not the editable install of the checkout
        probe = subprocess.run(
            [sys.executable, "-c", "import common, level0_single_process; print(common.__file__)"],
            cwd=base,
            env={**os.environ, "PYTHONPATH": str(base)},
            capture_output=True,
            text=True,
        )
        if not probe.stdout.strip().startswith(str(base)):
            raise SystemExit(
                f"the copy is not what python imports ({probe.stdout.strip()} {probe.stderr[-300:]})"
            )
        results = []
        t_all = time.perf_counter()
        for k, m in enumerate(chosen, 1):
            status, dt, why = run_one(m, base, args.timeout)
            results.append((m, status, why))
            print(f"[{k:2d}/{len(chosen)}] {status:8s} {dt:6.1f}s  {m.name}  {why}", flush=True)
    killed = sum(s == "KILLED" for _, s, _ in results)
    survived = [m.name for m, s, _ in results if s == "SURVIVED"]
    stale = [m.name for m, s, _ in results if s == "STALE"]
    print(
        f"\nkill rate: {killed}/{len(results)} = {killed / max(1, len(results)):.1%} "
        f"in {time.perf_counter() - t_all:.0f} s"
    )
    if survived:
        print("survived:", *survived, sep="\n  ")
    if stale:
        print("stale (fix the mutant):", *stale, sep="\n  ")
    sys.exit(1 if survived or stale else 0)


if __name__ == "__main__":
    main()
