"""The scripted oracle solves every public sample row and generated tasks of every family and tier, within
the shared budget, the 20-step agent budgets and the depth limit.

Episodes run root + children through ``SyncSession``s with a launch hook that builds child sessions and
drives them with the oracle (``oracle.run_oracle_episode``).

Run: ``pytest tests/test_textworld_sync_oracle.py -q -s`` (``-s`` prints the delegate=False report).
"""

from __future__ import annotations

import pytest

from common.envs.textworld_sync.oracle import OracleRun, sample_tasks_path, solve
from common.envs.textworld_sync.tasks import FAMILIES, TIERS, generate_tasks, load_tasks
from common.envs.textworld_sync.world import SyncWorld

SAMPLE = sample_tasks_path()


def _check_run(run: OracleRun, task_id: str) -> None:
    assert run.success, (
        f"{task_id}: {run.world.score()['completed_dishes']} dishes, failure={run.world.failure}"
    )
    assert run.world.steps_used <= run.world.spec.max_steps
    assert all(s.steps_used <= s.max_steps <= 20 for s in run.sessions)
    assert run.max_depth_used <= 3
    run.world.check_invariants()


@pytest.mark.parametrize("delegate", [None, True])
@pytest.mark.parametrize("interleave", [False, True])
def test_oracle_solves_every_public_sample_row(delegate, interleave):
    for row in load_tasks(SAMPLE):
        _check_run(solve(row, delegate=delegate, interleave=interleave), row["task_id"])


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("family", FAMILIES)
def test_oracle_solves_generated_tasks_of_every_family_and_tier(family, tier):
    for split in ("train", "dev", "test"):
        for row in generate_tasks(split, 2, seed=5, family=family, tier=tier):
            for delegate in (None, True):
                for interleave in (False, True):
                    _check_run(solve(row, delegate=delegate, interleave=interleave), row["task_id"])


def test_single_agent_oracle_report():
    """Without delegation the root has only 20 own steps: easy tasks fit, bigger tiers do not (reported,
    and asserted only for easy)."""
    lines, solved = [], {}
    for tier in TIERS:
        rows = generate_tasks("test", 7, seed=2, tier=tier)
        ok = [solve(r, delegate=False).success for r in rows]
        solved[tier] = sum(ok)
        lines.append(f"{tier}: {sum(ok)}/{len(ok)} solved by a single agent within 20 steps")
    print("\n" + "\n".join(lines))
    assert solved["easy"] == 7


def test_delegation_actually_uses_children_on_big_tasks():
    row = generate_tasks("test", 1, seed=0, family="hierarchical", tier="extreme")[0]
    run = solve(row)
    assert run.success and len(run.sessions) == 1 + len(row["dishes"])
    assert run.root.steps_used <= 20 and run.root.delegation_events == 1
    agents = {e["agent_id"] for e in run.world.events()}
    assert len(agents) >= len(row["dishes"])


def test_oracle_on_a_fork_leaves_the_live_world_untouched():
    row = generate_tasks("train", 1, seed=0, family="dependency_gate", tier="medium")[0]
    live = SyncWorld(row)
    branch = live.fork()
    run = solve(row, world=branch)
    assert run.success and branch.root_success()
    assert live.steps_used == 0 and not live.root_success()
    live.commit(branch)
    assert live.root_success()


@pytest.mark.parametrize("tier", TIERS)
def test_oracle_also_solves_the_strict_rules(tier):
    for family in FAMILIES:
        row = generate_tasks("test", 1, seed=7, family=family, tier=tier)[0]
        run = solve(row, rules="strict")
        assert run.world.spec.strict
        _check_run(run, row["task_id"])
