"""A round's task groups (common/run/rollout.py: collect_groups): spare groups in flight accept exactly the
groups that replacing one group at a time accepts, with the same tasks, seeds and sampler cursor."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest

import common.run.rollout as rollout
from common.run.data import TaskSampler, hash_seed
from common.train_config import TrainConfig

PRESET = SimpleNamespace(generate_rubrics=True, execution_reward="rubric")


def reference(cfg, rnd: int, sampler: TaskSampler, signal) -> tuple[list[tuple[int, int]], int]:
    """The rule as SPEC.md §4 states it: draw a task, roll it out, keep it if it has signal or no replacement
    is left, else draw the next one. A group here is (task id, seed of its rollout 0)."""
    groups, replaced = [], 0
    while len(groups) < cfg.tasks_per_step:
        task = sampler.next()
        group = (task["id"], hash_seed(cfg.seed, rnd, sampler.cursor, 0))
        if signal(task["id"]) or cfg.max_task_replacements - replaced <= 0:
            groups.append(group)
        else:
            replaced += 1
    return groups, replaced


def fake_config(**kw) -> SimpleNamespace:
    base = dict(env="textcraft", seed=3, rollout=None, rollouts_per_task=2, tasks_per_step=1)
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("tasks_per_step,max_task_replacements", [(1, 1), (1, 3), (2, 3), (3, 2)])
def test_spares_accept_what_one_at_a_time_replacement_accepts(
    monkeypatch, tasks_per_step, max_task_replacements
):
    """Every pattern of signal over the tasks drawn, every spare count, level 0's waves (one group still needed
    at a time) and level 1's (all of them): the same groups, replaced count and next cursor as the rule."""
    pool = [{"id": i} for i in range(8)]
    monkeypatch.setattr(rollout, "stage_runtime_config", lambda env, base, stage, rubrics, seed: seed)
    for bits in itertools.product([False, True], repeat=6):

        def signal(task_id: int, bits=bits) -> bool:  # which tasks have a signal: one pattern per `bits`
            return bits[task_id % len(bits)]

        monkeypatch.setattr(
            rollout, "accept_group", lambda trees, env, stage, reward, left: signal(trees[0]) or left <= 0
        )
        for spare_groups, per_wave in itertools.product([0, 1, 2, 5], [1, None]):
            cfg = fake_config(
                tasks_per_step=tasks_per_step,
                max_task_replacements=max_task_replacements,
                spare_groups=spare_groups,
            )
            waves: list[int] = []

            def roll(jobs, waves=waves):
                waves.append(len(jobs))
                return [
                    (task["id"], rcfgs[0]) for task, rcfgs in jobs
                ]  # a "group": task id, rollout 0's seed

            want_sampler, got_sampler = TaskSampler(pool, 0, cursor=5), TaskSampler(pool, 0, cursor=5)
            want = reference(cfg, 7, want_sampler, signal)
            got = rollout.collect_groups(cfg, "execution", 7, got_sampler, PRESET, roll, per_wave)
            assert got == want, (bits, spare_groups, per_wave)
            assert got_sampler.cursor == want_sampler.cursor  # the next round draws what it would have drawn
            rolled, replaced = sum(waves), want[1]
            if spare_groups == 0:  # one at a time: only what is judged is rolled out
                assert rolled == tasks_per_step + replaced
            else:  # spares ride along: never fewer waves, never beyond the replacements allowed
                assert rolled <= tasks_per_step + max_task_replacements
                if per_wave is None and replaced <= min(spare_groups, max_task_replacements):
                    assert len(waves) == 1, (
                        bits,
                        spare_groups,
                        waves,
                    )  # every stand-in was already in flight


def test_only_stages_that_replace_roll_spares(monkeypatch):
    monkeypatch.setattr(rollout, "stage_runtime_config", lambda env, base, stage, rubrics, seed: seed)
    pool = [{"id": i} for i in range(4)]
    cfg = fake_config(tasks_per_step=2, max_task_replacements=3, spare_groups=2)
    assert rollout.spares_in_flight(cfg, "execution", 0) == 2
    assert rollout.spares_in_flight(cfg, "execution", 2) == 1  # never more than the replacements left
    assert rollout.spares_in_flight(cfg, "delegation", 0) == rollout.spares_in_flight(cfg, "rubric", 0) == 0
    assert rollout.spares_in_flight(fake_config(**{**vars(cfg), "env": "textworld"}), "execution", 0) == 0
    waves: list[int] = []
    sampler = TaskSampler(pool, 0)
    rollout.collect_groups(
        cfg, "rubric", 0, sampler, PRESET, lambda jobs: waves.append(len(jobs)) or jobs, None
    )
    assert waves == [2] and sampler.cursor == 2


@pytest.mark.slow
def test_spare_groups_change_nothing_but_the_schedule_in_a_real_round(tmp_path: Path, monkeypatch):
    """The tiny model on TextCraft, one call at a time (max_batch_size 1: bit-exact), one Execution round of
    level 0 with 2 task groups and replacements: the same trees (every reply's tokens), replaced count and
    cursor with 0, 1 and 3 spare groups, in fewer waves."""
    import level0_single_process.train as level0
    from common.agent.judge import make_judge
    from common.policy.models import load_model
    from common.run.data import task_pool
    from common.run.setup import method_and_schedule, train_policy

    waves: list[int] = []
    real = level0.rollout_in_flight

    def counting(jobs, *args):
        waves.append(len(jobs))
        return real(jobs, *args)

    monkeypatch.setattr(level0, "rollout_in_flight", counting)
    results = {}
    for spare_groups in (0, 1, 3):
        cfg = TrainConfig.make(
            env="textcraft", model="tiny", out=str(tmp_path / f"s{spare_groups}"), tasks_per_step=2,
            rollouts_per_task=2, max_steps=3, max_new_tokens=16, rubric_max_new_tokens=16, oracle_mix=0.7,
            score_noise=0.3, difficulty="medium", n_tasks=16, max_task_replacements=3, max_batch_size=1,
            codeact_executor="worker-ordered", spare_groups=spare_groups,
        )  # fmt: skip
        preset, _ = method_and_schedule(cfg)
        model, tokenizer = load_model(cfg.model, dtype="float32", seed=cfg.seed)
        policy = train_policy(cfg, model, tokenizer, max_batch_size=1)
        env = level0.make_env_with_prompts(cfg.env, None, cfg.codeact_executor)
        sampler = TaskSampler(task_pool(cfg.env, None, cfg.n_tasks, cfg.seed, cfg.difficulty), cfg.seed)
        waves.clear()
        judge = make_judge("programmatic", policy)
        groups, replaced = level0.collect_groups(cfg, "execution", 0, sampler, env, policy, judge, preset)
        replies = [
            (
                t.task_id,
                [
                    ([s.call.output_ids for s in n.steps], n.rubric_call and n.rubric_call.output_ids)
                    for n in t.nodes.values()
                ],
            )
            for g in groups
            for t in g
        ]
        results[spare_groups] = (replies, replaced, sampler.cursor, list(waves))
    replies, replaced, cursor, one_at_a_time = results[0]
    assert replaced >= 1, "this round must replace a group, or it tests nothing"
    assert one_at_a_time == [1] * (2 + replaced)
    for spare_groups in (1, 3):
        assert results[spare_groups][:3] == (replies, replaced, cursor)
        assert len(results[spare_groups][3]) < len(one_at_a_time)
