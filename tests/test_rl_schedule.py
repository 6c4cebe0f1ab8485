"""Stage schedule and method presets (common/rl/schedule.py).

Run: pytest tests/test_rl_schedule.py
"""

from __future__ import annotations

import pytest

from common.rl.schedule import PRESETS, MethodPreset, Schedule, get_preset, stage_at


def test_paper_cycle():
    s = Schedule.parse("execution:16,delegation:2,rubric:2")
    assert s.period == 20
    cycle = ["execution"] * 16 + ["delegation"] * 2 + ["rubric"] * 2
    assert [s.stage_at(i) for i in range(60)] == cycle * 3
    assert str(s) == "execution:16,delegation:2,rubric:2"
    assert stage_at("execution:16,rubric:2", 16) == "rubric" and stage_at(s, 40) == "execution"


def test_parse_variants_and_errors():
    assert Schedule.parse("execution").cycle == (("execution", 1),)
    assert Schedule.parse(" execution : 3 , rubric:1 ").period == 4
    for bad in ("", "exec:16", "execution:x", "execution:0", "rubric:-1"):
        with pytest.raises(ValueError):
            Schedule.parse(bad)
    with pytest.raises(ValueError):
        Schedule.parse("execution:1").stage_at(-1)


def test_presets_match_spec_rows():
    rows = {
        # name: (execution reward, rubrics written, rubric training, leaf delegation reward)
        "rao": ("binary", False, False, False),
        "rao_d": ("binary", False, False, True),
        "sera_wo_d_rt": ("rubric", True, False, False),
        "sera_wo_d": ("rubric", True, True, False),
        "sera": ("rubric", True, True, True),
    }
    assert set(PRESETS) == set(rows)
    for name, (reward, gen, train, leaf) in rows.items():
        p = get_preset(name)
        assert (p.execution_reward, p.generate_rubrics, p.train_rubrics, p.leaf_delegation_reward) == (
            reward,
            gen,
            train,
            leaf,
        )
    assert get_preset("sera").schedule == "execution:16,delegation:2,rubric:2"
    assert get_preset("sera_wo_d").schedule == "execution:16,rubric:2"
    # public Scripts/Main/*/rao_with_decomposition_reward.sh: stage_schedule="execution:12,delegation:4"
    assert get_preset("rao_d").schedule == "execution:12,delegation:4"
    assert [get_preset("rao_d").parsed_schedule.stage_at(i) for i in (11, 12, 15, 16)] == [
        "execution",
        "delegation",
        "delegation",
        "execution",
    ]
    assert get_preset("SERA-wo-D") is get_preset("sera_wo_d")


def test_preset_errors():
    with pytest.raises(ValueError, match="choose one of"):
        get_preset("grpo")
    with pytest.raises(ValueError):
        MethodPreset("x", "binary", "execution:16,rubric:2")  # rubric training without rubrics
    with pytest.raises(ValueError):
        MethodPreset("x", "judge", "execution:1")
