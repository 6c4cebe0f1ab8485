"""Tests of the TextWorld-Sync prompt templates: every text is a file in ``templates/``, the public structure
(sections, turn header, per-turn lines, tags, JSON keys), and substitution of a user's template directory.

Run: ``pytest tests/test_textworld_sync_prompts.py -q``.
"""

from __future__ import annotations

import json
import re

import pytest

from common.envs.textworld_sync.prompts import (
    FIELDS,
    TEMPLATE_DIR,
    PromptTemplateError,
    default_prompts,
    load_prompts,
)
from common.envs.textworld_sync.tasks import make_row
from common.envs.textworld_sync.world import SyncWorld

TASK = make_row([[("salt", ("raw", "uncut"), "kitchen.counter")]], description="Eat dish_1.")


def test_every_template_is_a_packaged_file_and_uses_only_its_fields():
    assert sorted(p.stem for p in TEMPLATE_DIR.glob("*.txt")) == sorted(FIELDS)
    p = default_prompts()
    assert p.source == "default" and set(p.templates) == set(FIELDS)


def test_system_prompt_structure():
    p = default_prompts()
    s = p.system("0.1", 1, 3)
    assert "You are Agent 0.1." in s and "delegation depth is 1" in s
    assert (
        s.index("<TIPS>")
        < s.index("INTERACTION STRATEGY:")
        < s.index("DELEGATION STRATEGY:")
        < s.index("</TIPS>")
    )
    assert "BUDGET-AWARE COLLABORATION:" in s and "SUBAGENT ACTION:" in s
    examples = re.findall(r"<delegate>(.*?)</delegate>", s)
    assert [sorted(json.loads(e)) for e in examples] == [["goal"], ["delegations"]]
    assert "The maximum delegation depth is 3; the current depth is 1." in s
    leaf = p.system("x", 3, 3)
    assert "DELEGATION STRATEGY:" not in leaf and "<TIPS>" in leaf and "</TIPS>" in leaf


def test_initial_and_turn_messages_have_the_public_lines():
    p = default_prompts()
    w = SyncWorld(TASK)
    obs, infos = w.observe_with_infos("0")
    first = p.initial_user("Eat dish_1.", obs, infos, 20)
    heads = re.findall(r"^# (.+)$", first, flags=re.M)
    assert heads == ["Task", "Initial Observation", "Valid Actions", "Action Space", "Delegation"]
    assert "Budget: You have a total budget of 20 steps to complete this task." in first
    assert first.endswith("Now provide the first action or delegation.")
    for tag in ("<action>", "<delegate>", "<finish>"):
        assert tag in first
    solo = p.initial_user("Eat dish_1.", obs, infos, 20, allow_subagents=False)
    assert "# Delegation" not in solo and "<delegate>" not in solo
    out = w.step("0", "take salt")
    t = p.turn(4, out.observation, out.infos, 20)
    assert t.startswith("[Step 4 Observation]\nYou are in the kitchen.")
    expected = [
        "Budget used by current Agent: 5/20 steps.",
        "Current Agent remaining budget: 15 steps.",
        "Valid Actions: - look around",
        "Score: 0.0",
        "Task Success: False",
        "Task Failure: False",
        "Done: False",
    ]
    positions = [t.index(line) for line in expected]
    assert positions == sorted(positions)
    assert t.endswith("Provide your next action or delegation.")
    assert p.turn(30, "", {}, 20).count("Budget used by current Agent: 20/20 steps.") == 1  # clamped
    assert "(No observation)" in p.turn(0, "", {}, 20) and "Valid Actions: (none)" in p.turn(0, "", {}, 20)


def test_results_and_lookup_blocks():
    p = default_prompts()
    child = {
        "agent_id": "0.1",
        "returned": True,
        "environment_success": False,
        "steps": 3,
        "max_steps": 20,
        "finish_message": "",
        "final_observation": "x" * 5000,
    }
    text = p.delegation_results([child], "OBS")
    assert text.startswith(
        "[SubAgent Results]\n- Agent 0.1: returned=True, environment_success=False, steps=3\n"
    )
    assert (
        "Budget used by subagent: 3/20 steps. Total remaining budget for this SubAgent task is 17 steps."
        in text
    )
    assert "result: (no explicit finish message)" in text and "x" * 1200 in text and "x" * 1201 not in text
    assert text.endswith("\n\n[Current Environment Observation]\nOBS")
    assert p.inventory_lookup("", "OBS").startswith("[Inventory Lookup]\nCurrent shared inventory")


def test_a_user_directory_replaces_only_the_files_it_holds(tmp_path):
    (tmp_path / "system.txt").write_text("SYS ${agent_id} at ${depth}; costs $$5\n")
    p = load_prompts(tmp_path)
    assert p.source == str(tmp_path)
    assert p.system("7", 2, 3) == "SYS 7 at 2; costs $5"
    assert p.turn(0, "o", {}, 3).startswith("[Step 0 Observation]")  # default kept


@pytest.mark.parametrize(
    "name, text, needle",
    [
        ("system.txt", "Hi ${agent}\n", "unknown placeholder"),
        ("turn.txt", "cost $5\n", "starts no placeholder"),
        ("sytem.txt", "typo\n", "unknown template name"),
    ],
)
def test_bad_user_templates_name_the_file(tmp_path, name, text, needle):
    (tmp_path / name).write_text(text)
    with pytest.raises(PromptTemplateError) as e:
        load_prompts(tmp_path)
    assert name in str(e.value) and needle in str(e.value)


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="prompt directory not found"):
        load_prompts(tmp_path / "nope")
