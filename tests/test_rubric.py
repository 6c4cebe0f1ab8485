"""Tests of common/agent/rubric.py: prompts, clip_middle, and both parsers (hand cases + fuzzing)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.agent.prompts import PromptTemplateError, load_templates
from common.agent.rubric import (
    PARENT_CONTEXT_CHARS,
    Rubric,
    RubricContext,
    RubricItem,
    RubricParseError,
    Score,
    ScoreParseError,
    build_rubric_messages,
    build_score_messages,
    clip_middle,
    parse_rubric,
    parse_score,
    serialise_trajectory,
    stable_json,
    trajectory_payload,
)
from common.agent.tree import CallRecord, Node, Step

GOOD_ITEMS = [
    {
        "name": "crafted",
        "weight": 5,
        "description": "targets in inventory",
        "score_0": "none",
        "score_full": "all",
    },
    {"name": "no waste", "weight": 3, "description": "d", "score_0": "a", "score_full": "b"},
    {"name": "report", "weight": 2, "description": "d", "score_0": "a", "score_full": "b"},
]
GOOD = {
    "rubric_items": GOOD_ITEMS,
    "success_gate": "2x a1_i5 more than before",
    "failure_conditions": ["crashed", "consumed targets"],
    "scoring_procedure": "weighted sum",
}


def _weights_ok(r: Rubric) -> None:
    assert len(r.items) >= 2
    assert abs(math.fsum(r.weights) - 1.0) <= 1e-9
    assert all(math.isfinite(w) and w >= 0 for w in r.weights)


# ---- clip_middle --------------------------------------------------------------------------------------
def test_clip_middle_short_text_unchanged():
    assert clip_middle("abc", 10) == "abc"
    assert clip_middle("x" * 12000) == "x" * 12000


def test_clip_middle_head_quarter_tail_three_quarters():
    text = "".join(chr(ord("a") + i % 26) for i in range(30000))
    out = clip_middle(text, 12000, marker="|")
    head, tail = out.split("|")
    assert len(head) == 3000 and len(tail) == 9000
    assert text.startswith(head) and text.endswith(tail)
    default = clip_middle(text)
    assert "18000 characters omitted" in default
    assert default.startswith(text[:3000]) and default.endswith(text[-9000:])


@given(st.text(max_size=300), st.integers(min_value=0, max_value=200))
def test_clip_middle_lengths(text, limit):
    out = clip_middle(text, limit, marker="<cut>")
    if len(text) <= limit:
        assert out == text
    else:
        assert len(out) == limit + len("<cut>")
        head_n = limit // 4
        assert out[:head_n] == text[:head_n]
        tail_n = limit - head_n
        assert out[len(out) - tail_n :] == text[len(text) - tail_n :]


# ---- rubric parsing: hand cases ---------------------------------------------------------------------------
def test_parse_plain_json_renormalises():
    r = parse_rubric(json.dumps(GOOD))
    assert [i.name for i in r.items] == ["crafted", "no waste", "report"]
    assert r.weights == pytest.approx((0.5, 0.3, 0.2))
    _weights_ok(r)
    assert r.success_gate == "2x a1_i5 more than before"
    assert r.failure_conditions == ("crashed", "consumed targets")
    assert r.items[0].score_full == "all"


def test_parse_fenced_block_in_prose():
    text = "Here is my rubric:\n```json\n" + json.dumps(GOOD, indent=2) + "\n```\nHope it helps {really}."
    r = parse_rubric(text)
    assert len(r.items) == 3


def test_parse_embedded_in_prose_first_brace_to_last_brace():
    assert len(parse_rubric("Sure. " + json.dumps(GOOD) + " Done.").items) == 3
    d = json.loads(json.dumps(GOOD))
    d["rubric_items"][0]["description"] = 'inventory must equal {"a1_i5": 2} } {'
    r = parse_rubric("prefix " + json.dumps(d) + " suffix")
    assert r.items[0].description == 'inventory must equal {"a1_i5": 2} } {'


SCORE = {"success": True, "final_score": 0.5}


@pytest.mark.parametrize(
    "text",
    [
        # first { to last } is not JSON (a stray brace in the prose after the object): no candidate
        "Sure. " + json.dumps(GOOD) + " Note: the gate uses {set} notation }",
        "prefix { not json " + json.dumps(GOOD) + " suffix",
        # the first object found wins, whatever its keys: a later rubric is never searched for
        'Example item: {"name": "x", "weight": 1}. Rubric: ' + json.dumps(GOOD),
        '```json\n{"name": "x", "weight": 1}\n```\n```json\n' + json.dumps(GOOD) + "\n```",
    ],
)
def test_json_discovery_is_the_public_rule_rubric(text):
    """Public ``Runtime/rubric/scoring.py: extract_json_object``: the whole text, each fenced block, first
    ``{`` to last ``}``; the first candidate that is a dict is the answer. Before #36 a ``raw_decode`` scan
    and a search for the first object holding ``rubric_items`` accepted all of these."""
    with pytest.raises(RubricParseError):
        parse_rubric(text)


@pytest.mark.parametrize(
    "text, ok",
    [
        ("Here: " + json.dumps(SCORE) + ' and more {"x": 1}', False),  # the audit's example
        ('```json\n{"x": 1}\n```\nScore: ' + json.dumps(SCORE), False),  # a fenced dict comes first
        ("```\n" + json.dumps(SCORE) + '\n```\n```json\n{"x": 1}\n```', True),  # the first fence wins
        ("The score: " + json.dumps(SCORE), True),
    ],
)
def test_json_discovery_is_the_public_rule_score(text, ok):
    if ok:
        assert parse_score(text).final_score == 0.5
    else:
        with pytest.raises(ScoreParseError):
            parse_score(text)


def test_item_level_rule_drops_malformed_items():
    items = GOOD_ITEMS + [
        "not an object",
        {"weight": 1},  # no name
        {"name": "  ", "weight": 1},  # blank name
        {"name": "w-str", "weight": "0.4"},  # weight not a number
        {"name": "w-bool", "weight": True},
        {"name": "bad-text", "weight": 1, "description": 3},
    ]
    r = parse_rubric(json.dumps({"rubric_items": items}))
    assert [i.name for i in r.items] == ["crafted", "no waste", "report"]
    assert r.success_gate == "" and r.failure_conditions == () and r.scoring_procedure == ""


@pytest.mark.parametrize(
    "items, why",
    [
        ([{"name": "a", "weight": 1}], "at least 2"),
        ([{"name": "a", "weight": 0}, {"name": "b", "weight": 0}], "sum to 0"),
        ([{"name": "a", "weight": 1}, {"name": "b", "weight": -1}], "negative"),
        ([{"name": "a", "weight": 1}, {"name": "b", "weight": float("nan")}], "non-finite"),
        ([{"name": "a", "weight": 1}, {"name": "b", "weight": float("inf")}], "non-finite"),
    ],
)
def test_rejects_bad_weights(items, why):
    with pytest.raises(RubricParseError, match=why):
        parse_rubric(json.dumps({"rubric_items": items}))


def test_huge_finite_weights_do_not_overflow():
    r = parse_rubric('{"rubric_items": [{"name": "a", "weight": 1e308}, {"name": "b", "weight": 1e308}]}')
    assert r.weights == (0.5, 0.5)
    tiny = parse_rubric('{"rubric_items": [{"name": "a", "weight": 5e-324}, {"name": "b", "weight": 0}]}')
    assert tiny.weights == (1.0, 0.0)


def test_huge_integer_weight_is_non_finite():
    big = "1" + "0" * 400  # a valid JSON integer that no float can hold
    with pytest.raises(RubricParseError, match="non-finite"):
        parse_rubric('{"rubric_items": [{"name": "a", "weight": ' + big + '}, {"name": "b", "weight": 1}]}')


@pytest.mark.parametrize(
    "text",
    [
        "",
        "no json here",
        "{",
        '{"rubric_items": "x"}',
        '{"rubric_items": [1, 2]}',
        '{"rubric_items": [{"name": "a", "weight": 1}, {"name": "b", "weight": 1}], "success_gate": 3}',
        '{"rubric_items": [{"name": "a", "weight": 1}, {"name": "b", "weight": 1}], "failure_conditions": 3}',
        "[" * 100000,
        "{" * 100000,
        '{"a":' * 50000,
    ],
    ids=lambda t: t[:30],
)
def test_rubric_parse_failures(text):
    with pytest.raises(RubricParseError):
        parse_rubric(text)


def test_rubric_is_frozen_and_roundtrips():
    r = parse_rubric(json.dumps(GOOD))
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.success_gate = "changed"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.items[0].weight = 1.0  # type: ignore[misc]
    assert isinstance(r.items, tuple) and isinstance(r.failure_conditions, tuple)
    with pytest.raises(TypeError):
        r.items[0] = r.items[1]  # type: ignore[index]
    d = r.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert Rubric.from_dict(d) == r
    assert parse_rubric(json.dumps(d)) == r or parse_rubric(json.dumps(d)).weights == pytest.approx(r.weights)
    bad = dict(d, rubric_items=[dict(d["rubric_items"][0], weight=5.0), d["rubric_items"][1]])
    with pytest.raises(ValueError, match="sum to"):
        Rubric.from_dict(bad)


def test_rubric_lists_become_tuples():
    r = Rubric(items=[RubricItem("a", 0.5), RubricItem("b", 0.5)], failure_conditions=["x"])  # type: ignore[arg-type]
    assert isinstance(r.items, tuple) and r.failure_conditions == ("x",)
    hash(r)


# ---- score parsing: hand cases ---------------------------------------------------------------------------
def test_parse_score_ok():
    s = parse_score(
        'I think: ```json\n{"success": true, "criterion_scores": [1, 0.5, {"name": "c", "score": 0}],'
        ' "final_score": 0.75, "reason": " fine "}\n```'
    )
    assert s == Score(True, (1.0, 0.5, 0.0), 0.75, "fine")


@pytest.mark.parametrize(
    "obj, ok",
    [
        ({"success": False, "final_score": 0}, True),
        ({"success": False, "final_score": 0.0}, True),
        ({"success": False, "final_score": 0.1}, False),
        ({"success": True, "final_score": 0}, False),
        ({"success": True, "final_score": 1}, True),
        ({"success": True, "final_score": 1.01}, False),
        ({"success": True, "final_score": -0.5}, False),
        ({"success": "true", "final_score": 0.4}, True),
        ({"success": " FALSE ", "final_score": 0}, True),
        ({"success": "yes", "final_score": 0.4}, False),
        ({"success": 1, "final_score": 0.4}, False),
        ({"success": True, "final_score": "0.4"}, True),
        ({"success": True, "final_score": "high"}, False),
        ({"success": True, "final_score": None}, False),
        ({"final_score": 0.4}, False),
        # informational fields never reject a score (public parse_policy_score ignores them)
        ({"success": True, "final_score": 0.4, "reason": 5}, True),
        ({"success": True, "final_score": 0.4, "criterion_scores": "1,2"}, True),
        ({"success": True, "final_score": 0.4, "criterion_scores": [{"name": "x"}]}, True),
        ({"success": True, "final_score": 0.4, "criterion_scores": ["NaN"]}, True),
    ],
)
def test_parse_score_rules(obj, ok):
    text = json.dumps(obj)
    if ok:
        s = parse_score(text)
        assert (s.success and s.final_score > 0) or (not s.success and s.final_score == 0)
    else:
        with pytest.raises(ScoreParseError):
            parse_score(text)


@pytest.mark.parametrize(
    "text", ['{"success": true, "final_score": NaN}', '{"success": true, "final_score": Infinity}']
)
def test_parse_score_non_finite(text):
    with pytest.raises(ScoreParseError, match="finite"):
        parse_score(text)


def test_a_criterion_without_a_numeric_score_keeps_the_overall_score():
    """Issue #20 item 4: public ``scoring.py: parse_policy_score`` ignores ``criterion_scores``, so one
    criterion scored "high" (or a count that differs from the rubric's items) does not drop the child."""
    text = (
        '{"success": true, "criterion_scores": [{"name": "a", "score": "high"}, {"name": "b", "score": 0.5}],'
        ' "final_score": 0.7, "reason": "mostly done"}'
    )
    s = parse_score(text)
    assert s == Score(True, (0.5,), 0.7, "mostly done")
    one = parse_score(
        '{"success": true, "criterion_scores": [{"name": "a", "score": "high"}], "final_score": 1}'
    )
    assert one.final_score == 1.0 and one.success and one.criterion_scores == ()
    # the overall score's own rules still hold
    with pytest.raises(ScoreParseError):
        parse_score(
            '{"success": true, "criterion_scores": [{"name": "a", "score": 1}], "final_score": "high"}'
        )


def test_negative_zero_is_normalised():
    s = parse_score('{"success": false, "final_score": -0.0}')
    assert s.final_score == 0.0 and math.copysign(1.0, s.final_score) == 1.0


# ---- prompts ------------------------------------------------------------------------------------------------
def _ctx(**kw) -> RubricContext:
    base = dict(
        parent_task="Craft the following items: 3x a1_i5",
        parent_depth=0,
        child_depth=1,
        fork_step=2,
        parent_messages=[
            {"role": "system", "content": "SYSTEM PROMPT"},
            {"role": "user", "content": "HEAD" + "m" * 30000 + "TAIL"},
        ],
        parent_action="await launch_subagent({'a1_i4': 2})",
        pre_call_state={"inventory": {"m3_ore": 4}},
        delegated_goal="Craft the following items: 2x a1_i4",
        child_tools="get_info, view_inventory, craft, finish, launch_subagent",
        child_max_steps=20,
        parent_agent_id="0",
    )
    base.update(kw)
    return RubricContext(**base)


SECTIONS = [
    "[Parent Task]",
    "[Parent Metadata Visible To Rubric Generator]",
    "[Parent Trajectory Before Delegation]",
    "[Parent Step: Delegation Decision]",
    "[Observable Pre-call Environment]",
    "[Delegated SubAgent Task]",
    "[Child Tools]",
    "[Child Execution Budget]",
]


def test_rubric_prompt_has_the_public_sections_in_order_and_json_values():
    msgs = build_rubric_messages(
        _ctx(parent_messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    )
    assert [m["role"] for m in msgs] == ["system", "user"]
    user = msgs[1]["content"]
    pos = [user.index(sec) for sec in SECTIONS]
    assert pos == sorted(pos)  # every section, in the public order
    assert (
        '{"child_depth": 1, "fork_step": 2, "parent_depth": 0, "parent_trajectory_id": "0"}' in user
    )  # sorted keys; training names the parent as public async_pipeline.py does
    assert "[Parent Message 0: system]\nS\n[Parent Message 1: user]\nU" in user
    assert '[Observable Pre-call Environment]\n{"inventory": {"m3_ore": 4}}' in user
    assert '[Child Tools]\n"get_info, view_inventory, craft, finish, launch_subagent"' in user
    assert "[Child Execution Budget]\n20" in user
    for key in (
        '"rubric_items"',
        '"success_gate"',
        '"failure_conditions"',
        '"scoring_procedure"',
        '"score_full"',
    ):
        assert key in user
    assert "Give 4 to 8 rubric_items" in user
    assert "JSON only" in msgs[0]["content"]


def test_rubric_context_block_is_cut_as_a_whole_head_quarter_tail_three_quarters():
    msgs = build_rubric_messages(_ctx(delegated_context="use the ore", extra={"env": "textcraft"}))
    user = msgs[1]["content"]
    marker = load_templates({"rubric_truncation": frozenset()})["rubric_truncation"]
    assert marker in user and "m" * 20000 not in user
    start = user.index("[Parent Task]")
    end = user.index("\n\nAnswer with exactly this JSON schema")
    block = user[start:end]
    assert len(block) == PARENT_CONTEXT_CHARS + len(marker)  # exactly 12,000 characters kept
    head, tail = block.split(marker)
    assert len(head) == PARENT_CONTEXT_CHARS // 4 and head.startswith("[Parent Task]")
    assert len(tail) == PARENT_CONTEXT_CHARS - PARENT_CONTEXT_CHARS // 4
    # the sections after the long parent trajectory survive in the tail, the metadata in the head
    for needle in (
        "TAIL",
        "await launch_subagent",
        "m3_ore",
        "2x a1_i4",
        "use the ore",
        "[Child Execution Budget]",
    ):
        assert needle in tail, needle
    assert '"env": "textcraft"' in head and "HEAD" in head


def test_score_prompt_payload_is_sorted_json_with_the_public_keys():
    rubric = parse_rubric(json.dumps(GOOD))
    traj = trajectory_payload(_node())
    msgs = build_score_messages(rubric, "Craft 2x a1_i4", traj, {"inventory": {"a1_i4": 2}})
    user = msgs[1]["content"]
    payload = stable_json(
        {
            "frozen_rubric": rubric.to_dict(),
            "delegated_task": "Craft 2x a1_i4",
            "trajectory": traj,
            "final_environment_state": {"inventory": {"a1_i4": 2}},
        }
    )
    assert payload in user
    start = user.index("{")
    obj = json.loads(user[start : start + len(payload)])
    assert list(obj) == ["delegated_task", "final_environment_state", "frozen_rubric", "trajectory"]
    for key in ('"success"', '"criterion_scores"', '"final_score"', '"reason"'):
        assert key in user.split(payload)[1]
    assert "exactly 0.0" in msgs[0]["content"]


def _node() -> Node:
    steps = [
        Step(index=i, call=CallRecord(role="act", messages=[], text=f"reply {i}"), observation=f"obs {i}")
        for i in range(3)
    ]
    return Node(
        node_id="0.1",
        parent_id="0",
        depth=1,
        fork_step=2,
        goal="g",
        max_steps=20,
        steps=steps,
        finished=True,
        finish_message="done it",
        success=True,
    )


def test_trajectory_payload_shape_and_no_env_verdict():
    node = _node()
    traj = trajectory_payload(node)
    assert set(traj) == {"task_goal", "steps", "finish_message", "error_message"}
    assert traj["steps"][1] == {"step": 1, "raw_response": "reply 1", "observation": "obs 1", "error": None}
    assert traj["finish_message"] == "done it" and traj["task_goal"] == "g"
    assert "success" not in stable_json(traj) and "reward" not in stable_json(traj)


def test_trajectory_payload_cuts_long_fields_and_middle_steps():
    node = _node()
    node.steps = [
        Step(
            index=i,
            call=CallRecord(role="act", messages=[], text=f"R{i}" + "r" * 3000),
            observation="o" * 9000,
        )
        for i in range(20)
    ]
    traj = trajectory_payload(node, max_chars=20_000)
    assert len(stable_json(traj)) <= 20_000
    steps = traj["steps"]
    assert steps[0]["step"] == 0 and steps[-1]["step"] == 19  # the first and the newest steps are kept
    assert steps[1]["omitted_steps"] == 20 - (len(steps) - 1)
    assert all(len(s.get("observation", "")) <= 6_000 + 60 for s in steps)


def test_serialise_trajectory_text_for_the_judge():
    node = _node()
    traj = serialise_trajectory(node)
    assert "reply 0" in traj and "obs 2" in traj and "Steps used: 3/20" in traj and "done it" in traj
    assert "success" not in traj.lower()  # the env verdict is never shown
    node.steps[1].observation = "x" * 50000
    clipped = serialise_trajectory(node, max_chars=1000)
    assert "characters omitted" in clipped and "Steps used: 3/20" in clipped and len(clipped) < 1300
    empty = serialise_trajectory(Node("c", "0", 1, 0, "g", 20, error="boom"))
    assert "took no steps" in empty and "boom" in empty and "Did not call finish" in empty


def test_prompts_dir_substitutes_templates_and_rejects_unknown_placeholders(tmp_path):
    (tmp_path / "rubric_system.txt").write_text("MY SYSTEM TEXT\n")
    (tmp_path / "score_user.txt").write_text("PAYLOAD=$payload costs $$5\n")
    msgs = build_rubric_messages(_ctx(), prompts_dir=tmp_path)
    assert msgs[0]["content"] == "MY SYSTEM TEXT"  # one final newline dropped
    assert "[Parent Task]" in msgs[1]["content"]  # files the directory lacks fall back to the packaged ones
    score = build_score_messages(
        parse_rubric(json.dumps(GOOD)), "g", trajectory_payload(_node()), {}, tmp_path
    )
    assert score[1]["content"].startswith('PAYLOAD={"delegated_task": "g"') and score[1]["content"].endswith(
        "costs $5"
    )
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "rubric_user.txt").write_text("ok $context\nline two uses $secret_state\n")
    with pytest.raises(PromptTemplateError, match=r"rubric_user.txt:2: unknown placeholder \$secret_state"):
        build_rubric_messages(_ctx(), prompts_dir=bad)
    with pytest.raises(PromptTemplateError, match="does not exist"):
        build_rubric_messages(_ctx(), prompts_dir=tmp_path / "missing")
    from common.agent.runtime import RuntimeConfig

    with pytest.raises(PromptTemplateError, match="rubric_user.txt:2"):  # checked when the config is made
        RuntimeConfig(prompts_dir=str(bad))
    assert RuntimeConfig(prompts_dir=str(tmp_path)).prompts_dir == str(tmp_path)


def test_packaged_templates_are_package_data():
    from pathlib import Path

    import common.agent.prompts as pkg

    names = {p.stem for p in Path(pkg.__file__).parent.glob("*.txt")}
    assert {
        "rubric_system",
        "rubric_user",
        "rubric_context",
        "rubric_parent_message",
        "rubric_truncation",
        "score_system",
        "score_user",
        "delegated_task",
    } <= names


def test_metadata_keys_are_the_public_ones_in_training_and_at_test_time():
    """Public ``async_pipeline.py: _build_rubric_messages`` (training) names the parent
    ``parent_trajectory_id``; ``rubric_selector.py`` (test time) ``parent_agent_id``."""
    assert set(_ctx().metadata()) == {"parent_trajectory_id", "parent_depth", "child_depth", "fork_step"}
    assert set(_ctx(test_time=True).metadata()) == {
        "parent_agent_id",
        "parent_depth",
        "child_depth",
        "fork_step",
    }


def test_the_parents_context_is_part_of_the_delegated_task_and_the_task_goal():
    """Public TextCraft ``launch_subagent`` appends the context to the child's goal: the rubric writer's
    delegated task and the scorer's ``task_goal`` hold it."""
    from common.agent.rubric import delegated_task

    whole = delegated_task("Craft the following items: 2x a1_i4", "use the ore")
    assert whole.startswith("Craft the following items: 2x a1_i4\n\n") and whole.endswith("use the ore")
    user = build_rubric_messages(_ctx(parent_messages=[], delegated_context="use the ore"))[1]["content"]
    assert "[Delegated SubAgent Task]\n" + whole + "\n\n[Child Tools]" in user
    assert trajectory_payload(_node(), task_goal=whole)["task_goal"] == whole
    assert trajectory_payload(_node())["task_goal"] == _node().goal


# ---- fuzzing -------------------------------------------------------------------------------------------------
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=25,
)
weights = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-5, max_value=10**400),
    st.text(max_size=5),
    st.booleans(),
    st.none(),
)
item = st.fixed_dictionaries(
    {},
    optional={
        "name": st.one_of(st.text(max_size=10), json_scalars),
        "weight": weights,
        "description": st.one_of(st.text(max_size=10), json_scalars),
        "score_0": st.text(max_size=10),
        "score_full": st.text(max_size=10),
    },
)
good_item = st.fixed_dictionaries(
    {
        "name": st.text(min_size=1, max_size=10).filter(str.strip),
        "weight": st.one_of(st.floats(0, 1e300), st.integers(0, 10**6)),
    },
    optional={
        "description": st.text(max_size=10),
        "score_0": st.text(max_size=5),
        "score_full": st.text(max_size=5),
    },
)
rubric_obj = st.fixed_dictionaries(
    {
        "rubric_items": st.one_of(
            st.lists(st.one_of(good_item, good_item, item, json_values), max_size=10), json_values
        )
    },
    optional={
        "success_gate": st.one_of(st.text(max_size=10), json_scalars),
        "failure_conditions": st.one_of(st.lists(st.text(max_size=5), max_size=3), json_values),
        "scoring_procedure": st.text(max_size=10),
    },
)
wrappers = st.sampled_from(
    ["{}", "```json\n{}\n```", "Here you go: {} thanks", "noise {{ {} }} trailing }", "{}\n```"]
)


def _dump(obj) -> str:
    return json.dumps(obj)  # allow_nan=True by default: NaN / Infinity appear as tokens


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(rubric_obj, wrappers)
def test_fuzz_parse_rubric_structured(obj, wrap):
    text = wrap.replace("{}", _dump(obj), 1)
    try:
        r = parse_rubric(text)
    except RubricParseError:
        return
    _weights_ok(r)
    assert all(isinstance(i.name, str) and i.name for i in r.items)


@FUZZ
@given(st.text(max_size=400))
def test_fuzz_parse_rubric_text(text):
    try:
        _weights_ok(parse_rubric(text))
    except RubricParseError:
        pass


@FUZZ
@given(
    st.lists(
        st.sampled_from(
            [
                "{",
                "}",
                '"',
                ":",
                ",",
                "[",
                "]",
                "rubric_items",
                "name",
                "weight",
                "1",
                "-1",
                "NaN",
                " ",
                "```",
                "json",
                "\n",
            ]
        ),
        max_size=60,
    )
)
def test_fuzz_parse_rubric_token_soup(tokens):
    try:
        _weights_ok(parse_rubric("".join(tokens)))
    except RubricParseError:
        pass


good_score = st.fixed_dictionaries(
    {"success": st.booleans(), "final_score": st.one_of(st.just(0), st.floats(0, 1))},
    optional={"criterion_scores": st.lists(st.floats(0, 1), max_size=4), "reason": st.text(max_size=10)},
)
any_score = st.fixed_dictionaries(
    {},
    optional={
        "success": st.one_of(
            st.booleans(), st.sampled_from(["true", "false", "True", "yes", "0"]), json_scalars
        ),
        "final_score": st.one_of(
            st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3), json_scalars
        ),
        "criterion_scores": st.one_of(
            st.lists(st.one_of(st.floats(0, 1), json_values), max_size=5), json_values
        ),
        "reason": st.one_of(st.text(max_size=10), json_scalars),
    },
)
score_obj = st.one_of(good_score, any_score)


@FUZZ
@given(score_obj, wrappers)
def test_fuzz_parse_score_structured(obj, wrap):
    text = wrap.replace("{}", _dump(obj), 1)
    try:
        s = parse_score(text)
    except ScoreParseError:
        return
    _score_ok(s)


@FUZZ
@given(st.text(max_size=400))
def test_fuzz_parse_score_text(text):
    try:
        _score_ok(parse_score(text))
    except ScoreParseError:
        pass


def _score_ok(s: Score) -> None:
    assert isinstance(s.success, bool)
    assert math.isfinite(s.final_score) and 0.0 <= s.final_score <= 1.0
    assert (s.success and s.final_score > 0) or (not s.success and s.final_score == 0)
    assert all(math.isfinite(c) for c in s.criterion_scores)
    assert isinstance(s.reason, str)
