"""Tests of the TextWorld-Sync environment contract: sessions, replies, delegation and results blocks.

Sessions are driven directly: launch hooks below build child sessions and run them with the oracle.

Run: ``pytest tests/test_textworld_sync_env.py -q``.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from common.envs.base import ChildResult, LaunchRequest
from common.envs.textworld_sync.env import SyncSession, TextWorldSyncEnv
from common.envs.textworld_sync.oracle import oracle_reply
from common.envs.textworld_sync.tasks import generate_tasks, make_row
from common.envs.textworld_sync.world import SyncWorld

TWO = [
    [("salt", ("raw", "uncut"), "pantry.shelf"), ("carrot", ("grilled", "diced"), "kitchen.fridge")],
    [("banana", ("fried", "uncut"), "kitchen.counter"), ("cilantro", ("raw", "chopped"), "kitchen.fridge")],
]


def make_task(dishes, **kw) -> dict:
    return make_row(dishes, description="hand-made test task", **kw)


ENV = TextWorldSyncEnv()


async def _no_launch(request: LaunchRequest) -> ChildResult:
    raise AssertionError("no delegation expected")


def root(task: dict, launch=_no_launch) -> tuple[SyncWorld, SyncSession]:
    w = ENV.make_world(task)
    return w, ENV.root_session(w, task, launch)


def oracle_hook(
    parent_ref: list, *, interleave: bool = False, fork: bool = False, created: list | None = None
):
    """A launch hook that builds a child session (on the live world, or on a fork committed afterwards)
    and runs it with the oracle."""

    async def launch(request: LaunchRequest) -> ChildResult:
        parent = parent_ref[0]
        world = parent.world.fork() if fork else parent.world
        ref: list = []
        parent.n_launched = getattr(parent, "n_launched", 0) + 1
        child = ENV.child_session(
            world,
            parent,
            request,
            f"{parent.agent_id}.{parent.n_launched}",
            oracle_hook(ref, interleave=interleave, fork=fork, created=created),
        )
        ref.append(child)
        if created is not None:
            created.append(child)
        child.first_user_message()
        for _ in range(child.max_steps):
            res = await child.step(oracle_reply(child))
            if interleave:
                await asyncio.sleep(0)
            if res.done:
                break
        if fork:
            parent.world.commit(world)
        return ChildResult(
            request=request,
            returned=child.finished,
            message=child.finish_message or "",
            steps_used=child.steps_used,
        )

    return launch


def test_prompts_and_first_message_have_the_public_sections():
    w, s = root(make_task(TWO))
    sys_prompt, first = s.system_prompt(), s.first_user_message()
    assert "You are Agent 0." in sys_prompt and "<TIPS>" in sys_prompt and "</TIPS>" in sys_prompt
    assert "DELEGATION STRATEGY:" in sys_prompt and "maximum delegation depth is 3" in sys_prompt
    for section in ("# Task", "# Initial Observation", "# Valid Actions", "# Action Space", "# Delegation"):
        assert f"\n{section}\n" in f"\n{first}", section
    assert "hand-made test task" in first and "total budget of 20 steps" in first
    assert "\n- take carrot\n" in first and "Valid Actions are listed below." in first
    deepest = SyncSession(w, agent_id="x", depth=3, goal="g", max_steps=5, launch=_no_launch)
    assert "DELEGATION STRATEGY:" not in deepest.system_prompt()


def test_every_turn_carries_the_public_per_turn_lines():
    w, s = root(make_task(TWO))
    r = asyncio.run(s.step("<action>take carrot</action>"))
    obs = r.observation
    assert obs.startswith("[Step 0 Observation]\nYou are in the kitchen.")
    for line in (
        "Budget used by current Agent: 1/20 steps.",
        "Current Agent remaining budget: 19 steps.",
        "Score: 0.0",
        "Task Success: False",
        "Task Failure: False",
        "Done: False",
        "Shared tool cooldowns: none.",
        "Shared steps remaining: 59",
    ):
        assert line in obs, line
    head, valid = obs.split("Valid Actions are listed below.")  # valid actions listed separately
    assert "dice carrot" not in head and "\nValid Actions: - look around\n- inventory\n" in valid
    assert "- dice carrot\n- cook carrot on grill" in valid
    r2 = asyncio.run(s.step("<action>look around</action>"))
    assert r2.observation.startswith("[Step 1 Observation]") and "2/20 steps" in r2.observation


def test_inventory_lookups_are_free_for_the_world():
    w, s = root(make_task(TWO))
    asyncio.run(s.step("<action>take carrot</action>"))
    for reply in (
        "<action>inventory</action>",
        "<action>View Inventory</action>",
        "<action>check inventory</action>",
    ):
        r = asyncio.run(s.step(reply))
        assert r.info["kind"] == "inventory_lookup" and not r.done
        assert (
            "[Inventory Lookup]\nCurrent shared inventory (visible to all Agents):\ncarrot\n" in r.observation
        )
    assert w.steps_used == 1 and s.steps_used == 4  # each look-up is one of the agent's own steps


def test_malformed_reply_costs_one_shared_step_and_its_fallback_may_act():
    w, s = root(make_task(TWO))
    r = asyncio.run(s.step("I am not sure what to do."))
    assert r.info["kind"] == "error" and r.info["counted"] and not r.info["accepted"]
    assert w.steps_used == 1 and s.steps_used == 1
    r = asyncio.run(s.step("<action>take carrot</action><finish>done</finish>"))  # two kinds: malformed
    assert r.info["kind"] == "error" and r.info["accepted"]  # the public fallback runs the <action>
    assert w.steps_used == 2 and "carrot" in w.inventory_text()
    r = asyncio.run(s.step("Let me check.\nAction: inventory"))  # a malformed look-up stays free
    assert r.info["kind"] == "inventory_lookup" and w.steps_used == 2


def test_finish_and_own_budget_end_the_agent():
    w, s = root(make_task(TWO))
    r = asyncio.run(s.step("<finish>nothing to do</finish>"))
    assert r.done and r.finish_message == "nothing to do" and s.finished
    w2 = ENV.make_world(make_task(TWO))
    s2 = SyncSession(w2, agent_id="k", depth=1, goal="g", max_steps=2, launch=_no_launch)
    assert not asyncio.run(s2.step("<action>look around</action>")).done
    assert asyncio.run(s2.step("<action>look around</action>")).done


def test_every_agent_stops_once_the_world_has_ended():
    task = make_task(TWO, max_steps=3)
    w, s = root(task)
    other = SyncSession(w, agent_id="0.1", depth=1, goal="help", max_steps=20, launch=_no_launch)
    assert not asyncio.run(s.step("<action>look around</action>")).done
    assert not asyncio.run(other.step("<action>look around</action>")).done and not other.done
    r = asyncio.run(s.step("<action>look around</action>"))  # the third and last shared step
    assert r.done and "Done: True" in r.observation and w.over
    assert other.done  # the runtime can ask before calling the model again
    r2 = asyncio.run(other.step("<action>take carrot</action>"))
    assert r2.done and r2.info["kind"] == "world_ended" and w.steps_used == 3
    assert "carrot" not in w.inventory_text()


def test_the_step_that_completes_the_task_stops_the_agent():
    w, s = root(make_task([[("salt", ("raw", "uncut"), "kitchen.counter")]]))
    for a in ("take salt", "prepare dish_1"):
        assert not asyncio.run(s.step(f"<action>{a}</action>")).done
    r = asyncio.run(s.step("<action>eat dish_1</action>"))
    assert r.done and "Task Success: True" in r.observation and "Score: 1.0" in r.observation
    assert w.root_success() and s.success()


def _results_blocks(obs: str) -> list[str]:
    body = obs.split("[SubAgent Results]\n", 1)[1].split("\n\n[Current Environment Observation]")[0]
    return ["- Agent" + b for b in body.split("- Agent")[1:]]


@pytest.mark.parametrize("interleave", [False, True])
def test_delegation_runs_children_concurrently_and_reports_each(interleave):
    task = make_task(TWO)
    ref: list = []
    created: list = []
    w, s = root(task, oracle_hook(ref, interleave=interleave, created=created))
    ref.append(s)
    goals = {"delegations": [{"goal": "Prepare and eat dish_1"}, {"goal": "Prepare and eat dish_2"}]}
    r = asyncio.run(s.step(f"<delegate>{json.dumps(goals)}</delegate>"))
    assert r.info["kind"] == "delegate" and len(r.info["delegations"]) == 2
    assert "\n\n[Current Environment Observation]\nYou are in the kitchen." in r.observation
    blocks = _results_blocks(r.observation)
    assert len(blocks) == 2
    for k, b in enumerate(blocks, start=1):
        assert b.startswith(f"- Agent 0.{k}: returned=")
        m = re.search(
            r"steps=(\d+)\n  Budget used by subagent: (\d+)/20 steps. Total remaining budget "
            r"for this SubAgent task is (\d+) steps.",
            b,
        )
        assert m and m.group(1) == m.group(2) and int(m.group(3)) == 20 - int(m.group(1))
        assert "\n  result: " in b and "\n  final observation: You are in the " in b
    assert "environment_success=True" in blocks[-1]  # the whole task's success, as in public
    assert w.root_success() and s.success() and r.done  # the world ended during the delegation
    assert all(c.depth == 1 for c in created)
    w.check_invariants()


def test_children_start_where_the_root_stands():
    task = make_task(TWO)
    seen: list[str] = []

    async def launch(request: LaunchRequest) -> ChildResult:
        child = ENV.child_session(s.world, s, request, "0.1", _no_launch)
        seen.append(s.world.location(child.agent_id))
        return ChildResult(request=request, returned=False)

    w, s = root(task, launch)

    async def go():
        await s.step("<action>go to garden</action>")
        return await s.step('<delegate>{"goal": "Prepare and eat dish_1"}</delegate>')

    r = asyncio.run(go())
    assert seen == ["garden"]
    b = _results_blocks(r.observation)[0]
    assert "returned=False, environment_success=False" in b and "result: (no explicit finish message)" in b


def test_depth_limit_and_crashing_launches_become_text():
    async def launch(request: LaunchRequest) -> ChildResult:
        raise RuntimeError("boom")

    w, s = root(make_task(TWO), launch)
    r = asyncio.run(s.step('<delegate>{"delegations": [{"goal": "dish_1"}, {"goal": "dish_2"}]}</delegate>'))
    a, b = _results_blocks(r.observation)
    assert a.startswith("- Agent unknown: returned=False") and "SubAgent crashed: RuntimeError: boom" in a
    assert w.steps_used == 0 and not r.done
    deep = SyncSession(w, agent_id="d", depth=3, goal="g", max_steps=5, launch=_no_launch)
    r = asyncio.run(deep.step('<delegate>{"goal": "dish_1"}</delegate>'))
    assert r.observation.startswith(
        "[Step 0 Observation]\nSubAgent delegation rejected: current depth 3 reached the maximum allowed depth 3."
    )
    assert w.steps_used == 0 and deep.steps_used == 1


def test_child_budget_is_capped_at_twenty():
    seen: list[int] = []

    async def launch(request: LaunchRequest) -> ChildResult:
        seen.append(ENV.child_session(s.world, s, request, "0.1", _no_launch).max_steps)
        return ChildResult(request=request, returned=False)

    w, s = root(make_task(TWO), launch)
    asyncio.run(s.step('<delegate>{"goal": "dish_1", "max_steps": 50}</delegate>'))
    asyncio.run(s.step('<delegate>{"goal": "dish_2", "max_steps": "7"}</delegate>'))
    assert seen == [20, 7]
    sub = SyncSession(w, agent_id="0.9", depth=1, goal="g", max_steps=6, launch=launch)
    s = sub  # the hook builds children of `s`
    asyncio.run(sub.step('<delegate>{"goal": "dish_1", "max_steps": 15}</delegate>'))
    assert seen == [20, 7, 6]  # a sub-agent's children get at most its own budget (public)


def test_child_on_a_fork_is_committed_back():
    ref: list = []
    w, s = root(make_task(TWO), oracle_hook(ref, fork=True))
    ref.append(s)
    goals = {"delegations": [{"goal": "Prepare and eat dish_1"}, {"goal": "Prepare and eat dish_2"}]}
    r = asyncio.run(s.step(f"<delegate>{json.dumps(goals)}</delegate>"))
    assert r.info["kind"] == "delegate"
    assert w.root_success()  # both forks committed in turn (children run one after the other here)
    for b in _results_blocks(r.observation):
        assert "final observation: You are in" in b


def test_visible_state_is_the_agents_own_view():
    w, s = root(make_task(TWO))
    other = SyncSession(w, agent_id="0.1", depth=1, goal="g", max_steps=5, launch=_no_launch)
    asyncio.run(other.step("<action>go to pantry</action>"))
    asyncio.run(s.step("<action>take carrot</action>"))
    v = s.visible_state()
    # public rubric_selector.py: coordinator_state (and training TextWorldEnv.snapshot): these keys, in order
    assert list(v) == ["game", "agent_id", "location", "observation", "infos"]
    assert v["game"] == "cookingworld_multidish" and v["agent_id"] == "0" and v["location"] == "kitchen"
    assert (v["observation"], v["infos"]) == w.observe_with_infos("0")  # the world now, as public observes
    text = json.dumps(v)
    assert "pantry" not in text.replace("go to pantry", "").replace("move north", "")  # no other agent's room
    assert "grilled" not in text and "diced" not in text.replace("dice carrot", "")  # no hidden recipe
    assert "grilled" not in w.describe() and "pantry" not in w.describe()


def test_prompt_directory_substitution_reaches_the_sessions(tmp_path):
    (tmp_path / "turn.txt").write_text("STEP ${index} | ${observation} | done=${done}\n")
    env = TextWorldSyncEnv(prompts_dir=str(tmp_path))
    w = env.make_world(make_task(TWO))
    s = env.root_session(w, make_task(TWO), _no_launch)
    assert s.first_user_message().startswith("# Task")  # defaults kept for the other files
    r = asyncio.run(s.step("<action>look around</action>"))
    assert r.observation.startswith("STEP 0 | You are in the kitchen.") and r.observation.endswith(
        "done=False"
    )


def test_child_success_follows_its_goal():
    w = SyncWorld(make_task(TWO))
    kw = dict(max_steps=20, launch=_no_launch, start_from="0")
    dish = SyncSession(w, agent_id="a", depth=1, goal="Prepare and eat dish_2", **kw)
    item = SyncSession(w, agent_id="b", depth=1, goal="Get the carrot grilled and diced", **kw)
    vague = SyncSession(w, agent_id="c", depth=1, goal="help out", **kw)
    for a in ("take carrot", "dice carrot", "cook carrot on grill"):
        w.step("b", a)
    assert item.success() and not dish.success() and not vague.success()
    asyncio.run(vague.step("<finish>helped</finish>"))
    assert vague.success()


def test_many_concurrent_sessions_share_one_world_safely():
    task = generate_tasks("train", 1, seed=11, family="conflict", tier="hard")[0]
    w = ENV.make_world(task)
    sessions = [
        SyncSession(
            w,
            agent_id=f"0.{k}",
            depth=1,
            goal=f"Prepare and eat dish_{k % 4 + 1}",
            max_steps=20,
            launch=_no_launch,
            start_from="0",
        )
        for k in range(12)
    ]

    async def drive(sess: SyncSession) -> None:
        for _ in range(sess.max_steps):
            res = await sess.step(oracle_reply(sess))
            await asyncio.sleep(0)
            if res.done:
                break

    async def main() -> None:
        await asyncio.gather(*(drive(x) for x in sessions))

    asyncio.run(main())
    w.check_invariants()
    assert w.steps_used <= w.spec.max_steps
    assert w.failure is None


# ---- the training prompt set plays the public TRAINING runtime (textworld_continuous_policy/env.py) -----
TRAIN = TextWorldSyncEnv(prompt_set="training")
PUBLIC_DEPTH = (
    "Not enough budget to launch subagent for goal {goal}. Launching a subagent from depth 3 would exceed the "
    "maximum allowed depth of 3. The maximum depth for hierarchical delegation has been reached. You should "
    "perform the task yourself instead of delegating."
)


def _train_root(task: dict, launch=_no_launch) -> tuple[SyncWorld, SyncSession]:
    w = TRAIN.make_world(task)
    return w, TRAIN.root_session(w, task, launch)


def _scripted_hook(parent_ref: list, replies: list[str], seen: list):
    """Builds each child with TRAIN on the parent's live world and plays ``replies`` (then stops)."""

    async def launch(request: LaunchRequest) -> ChildResult:
        parent = parent_ref[0]
        child = TRAIN.child_session(
            parent.world, parent, request, f"{parent.agent_id}.{len(seen) + 1}", _no_launch
        )
        seen.append(child)
        child.first_user_message()
        for reply in replies[: child.max_steps]:
            if (await child.step(reply)).done:
                break
        return ChildResult(
            request=request,
            returned=child.finished,
            message=child.finish_message or "",
            steps_used=child.steps_used,
        )

    return launch


def test_training_delegation_turn_is_the_public_training_summary():
    """_child_result_summary over the launch coordinator's reports: no verdict, no final observation, no
    [Current Environment Observation]; the asked budget (50) is kept, not capped at 20."""
    ref, seen = [], []
    _, s = _train_root(
        make_task(TWO),
        _scripted_hook(ref, ["<action>look around</action>", "<finish>took it</finish>"], seen),
    )
    ref.append(s)
    s.first_user_message()
    r = asyncio.run(s.step('<delegate>{"goal": "Prepare and eat dish_1", "max_steps": 50}</delegate>'))
    assert seen[0].max_steps == 50 and s.uncapped_child_budgets
    head = r.observation.split("\n\nValid Actions: ", 1)[0]
    assert head == (
        "[Step 0 Observation]\n[SubAgent Results]\n- SubAgent 0: took it\n\nBudget used by subagent: 2/50 "
        "steps. Total remaining budget for the current task is 20 steps."
    )
    for eval_only in (
        "environment_success",
        "final observation",
        "[Current Environment Observation]",
        "Agent 0.1",
    ):
        assert eval_only not in r.observation


def test_training_launch_reports_follow_the_public_coordinator():
    """finish message, else error, else platoon's budget warning; '' leaves only the budget line; a
    counterfactual report and a refusal are the line as is; R = the parent's own budget before the step."""
    _, s = _train_root(make_task(TWO))
    s.steps_used = 3  # the parent's 4th step (index 3): R = 20 - 3
    req = LaunchRequest(goal="g", max_steps=4)
    rep = lambda res: s._launch_report(res, remaining=s.max_steps - 3)  # noqa: E731
    assert rep(ChildResult(req, True, "done", 2)).strip() == (
        "done\n\nBudget used by subagent: 2/4 steps. Total remaining budget for the current task is 17 steps."
    )
    exhausted = rep(ChildResult(req, False, "", 4))
    assert exhausted.startswith(
        "WARNING: Exhausted budget when running episode. Halting episode; task may be incomplete.\n\n"
    )
    block = s.prompts.train_delegation_results(
        [
            rep(ChildResult(req, False, "", 1)),  # the world ended under it: no message
            rep(ChildResult(req, False, "", 1, error="RuntimeError: boom")),
            rep(
                ChildResult(
                    req,
                    True,
                    "x",
                    1,
                    report="x\n\nSelected branch: 0; counterfactual branches collected: 4.\n",
                )
            ),
            rep(ChildResult(req, False, refused=True, error="Launch refused: too many.")),
            "",
        ]
    )
    assert block == (
        "[SubAgent Results]\n"
        "- SubAgent 0: Budget used by subagent: 1/4 steps. Total remaining budget for the current task is 17 steps.\n"
        "- SubAgent 1: RuntimeError: boom\n\nBudget used by subagent: 1/4 steps. Total remaining budget for the "
        "current task is 17 steps.\n"
        "- SubAgent 2: x\n\nSelected branch: 0; counterfactual branches collected: 4.\n"
        "- SubAgent 3: Launch refused: too many.\n"
        "- SubAgent 4: (no explicit return)"
    )


def test_training_malformed_reply_costs_no_world_step():
    """Public training: no valid block -> no world step, the turn shows the current observation; the error
    is recorded, never shown. Evaluation keeps the evaluator's fallback action (one shared step)."""
    w, s = _train_root(make_task(TWO))
    before = w.steps_used
    r = asyncio.run(s.step("I think I should go north\nmove north"))
    assert w.steps_used == before and w.location("0") == "kitchen" and s.steps_used == 1
    assert r.info["error"] and r.info["counted"] is False
    assert r.observation.startswith("[Step 0 Observation]\n" + w.observe("0") + "\n\nValid Actions: ")
    assert "valid TextWorld action block" not in r.observation
    we, se = root(make_task(TWO))
    asyncio.run(se.step("I think I should go north\nmove north"))
    assert we.steps_used == 1 and we.location("0") == "pantry"


def test_training_inventory_lookup_and_depth_limit_texts():
    _, s = _train_root(make_task(TWO))
    r = asyncio.run(s.step("<action>inventory</action>"))
    assert r.observation.startswith(
        "[Step 0 Observation]\n[Inventory Lookup]\nCurrent shared inventory:\n(empty)\n\nCurrent environment "
        "observation:\nYou are in the kitchen."
    )
    w = TRAIN.make_world(make_task(TWO))
    deep = SyncSession(
        w, agent_id="0.1.1.1", depth=3, goal="g", max_steps=5, launch=_no_launch, prompts=TRAIN.prompts
    )
    goals = {"delegations": [{"goal": "a"}, {"goal": "b"}]}
    r = asyncio.run(deep.step(f"<delegate>{json.dumps(goals)}</delegate>"))
    assert r.info["rejected"] and w.steps_used == 0
    assert r.observation.split("\n\nValid Actions: ")[0] == (
        "[Step 0 Observation]\n[SubAgent Results]\n- SubAgent 0: "
        + PUBLIC_DEPTH.format(goal="a")
        + "\n- SubAgent 1: "
        + PUBLIC_DEPTH.format(goal="b")
    )


def test_rubric_stage_depth_limit_is_the_public_collectors_text():
    """Public ``textworld_two_stage_rollout.py``: in a Rubric-stage rollout a launch past the maximum depth
    returns ``Cannot launch subagent beyond max_subagent_depth={m}.`` when the agent's enclosing branch
    (``current_branch``) is at the limit, i.e. for a counterfactual branch agent there (the runtime marks
    such sessions: ``counterfactual_rollout``, ``branch_depth``); an ordinary agent under a shallower branch
    gets the tracker's text (audit 2026-12-06 N3)."""
    goals = {"delegations": [{"goal": "a"}, {"goal": "b"}]}
    line = "Cannot launch subagent beyond max_subagent_depth=3."
    for branch_depth, expected in ((3, [line, line]), (1, [PUBLIC_DEPTH.format(goal=g) for g in "ab"])):
        w = TRAIN.make_world(make_task(TWO))
        deep = SyncSession(
            w, agent_id="0.1.1.1", depth=3, goal="g", max_steps=5, launch=_no_launch, prompts=TRAIN.prompts
        )
        deep.counterfactual_rollout, deep.branch_depth = True, branch_depth
        r = asyncio.run(deep.step(f"<delegate>{json.dumps(goals)}</delegate>"))
        assert r.info["rejected"] and w.steps_used == 0
        assert r.observation.split("\n\nValid Actions: ")[0] == (
            f"[Step 0 Observation]\n[SubAgent Results]\n- SubAgent 0: {expected[0]}\n- SubAgent 1: {expected[1]}"
        )
    assert deep.counterfactual_depth_refusal(None, 3, 3) == line


def test_rubric_stage_refusal_by_the_runtime_is_the_public_text_too():
    """The other path: a launch the session lets through (its own limit is 3) that the runtime's
    ``--max-depth`` refuses. In a Rubric-stage rollout the parent's ``- SubAgent i:`` line is the public
    collector's text with the runtime's limit; elsewhere it is not."""
    from common.agent.runtime import RuntimeConfig, run_root
    from common.policy.scripted import OraclePolicy

    line = "- SubAgent 0: Cannot launch subagent beyond max_subagent_depth=0."
    for k in (2, 1):
        cfg = RuntimeConfig(max_steps=6, max_depth=0, temperature=0.0, counterfactual_k=k)
        tree = asyncio.run(
            run_root(make_task(TWO), TRAIN, OraclePolicy(lambda s: oracle_reply(s, delegate=True)), cfg)
        )
        results = [s.observation for s in tree.root.steps if "[SubAgent Results]" in s.observation]
        assert results and sum(s.refused_launches for s in tree.root.steps) >= 1
        assert all((line in r) == (k > 1) for r in results)


def test_the_runtime_marks_every_session_of_a_rubric_stage_rollout():
    from common.agent.runtime import RuntimeConfig, run_root
    from common.envs.textworld_sync.oracle import oracle_reply
    from common.policy.scripted import OraclePolicy

    task = make_task(TWO)
    seen = []

    class Spy(OraclePolicy):
        async def generate(self, request):
            if request.session is not None:
                seen.append(request.session.counterfactual_rollout)
            return await super().generate(request)

    for k in (1, 2):
        seen.clear()
        cfg = RuntimeConfig(max_steps=4, temperature=0.0, counterfactual_k=k)
        asyncio.run(run_root(task, TRAIN, Spy(lambda s: oracle_reply(s, delegate=True)), cfg))
        assert seen and set(seen) == {k > 1}


def test_training_world_has_100_shared_steps_and_children_start_in_the_kitchen():
    """create_textworld_env: 100 whatever the row says; fork_shared: the phantom "root" stands in the
    kitchen; fork_counterfactual: a branch starts where its parent stands. Evaluation: the row's budget and
    the root's room."""
    task = make_task(TWO, max_steps=65)
    assert TRAIN.make_world(task).spec.max_steps == 100 and ENV.make_world(task).spec.max_steps == 65
    for env, live_room in ((TRAIN, "kitchen"), (ENV, "pantry")):
        w = env.make_world(task)
        parent = env.root_session(w, task, _no_launch)
        w.step("0", "go to pantry")
        req = LaunchRequest(goal="Prepare and eat dish_1", max_steps=30)
        child = env.child_session(w, parent, req, "0.1", _no_launch)
        branch = env.child_session(w.fork(), parent, req, "0.2", _no_launch)
        assert child.world.location("0.1") == live_room and branch.world.location("0.2") == "pantry"
        assert child.max_steps == (30 if env is TRAIN else 20)


def test_fork_budget_refusal_is_the_public_pseudo_child():
    """rubric_selector.py: select_delegated_trajectory: agent {parent}/fork-budget-exhausted-{group[:8]},
    max_steps = remaining_steps = the child's budget; other refusals keep the evaluator's crash record."""

    async def refuse(request: LaunchRequest) -> ChildResult:
        return ChildResult(request=request, returned=False, refused=True, error=ENV.fork_budget_text)

    _, s = root(make_task(TWO), refuse)
    r = asyncio.run(s.step('<delegate>{"goal": "Prepare and eat dish_1", "max_steps": 7}</delegate>'))
    m = re.search(r"- Agent 0/fork-budget-exhausted-([0-9a-f]{8}): ", r.observation)
    assert m, r.observation
    assert (
        "returned=False, environment_success=False, steps=0\n  Budget used by subagent: 0/7 steps. Total remaining "
        "budget for this SubAgent task is 7 steps.\n  result: Fork budget exhausted; complete this delegation "
        "locally.\n  final observation: \n\n[Current Environment Observation]\n"
    ) in r.observation
    _, again = root(make_task(TWO), refuse)
    r2 = asyncio.run(again.step('<delegate>{"goal": "Prepare and eat dish_1", "max_steps": 7}</delegate>'))
    assert r2.observation == r.observation  # the group id is a hash: repeats are exact


def test_evaluation_rebuilds_the_first_message_from_the_current_observation():
    """Public evaluator.py: _run_agent passes the CURRENT observation and the INITIAL infos to
    build_messages on every call, so "# Initial Observation" follows the agent while "# Valid Actions" stays
    the first list. Training keeps the first message of the agent's start (TextWorldAgent.act)."""
    from common.agent.runtime import RuntimeConfig, run_root
    from common.policy.scripted import ReplayPolicy

    task = make_task(TWO)
    replies = ["<action>go to pantry</action>", "<action>look around</action>", "<finish>x</finish>"]
    for env, moved in ((ENV, True), (TRAIN, False)):
        tree = asyncio.run(
            run_root(task, env, ReplayPolicy(replies), RuntimeConfig(max_steps=5, use_rubrics=False))
        )
        first, second = (tree.root.steps[i].call.messages[1]["content"] for i in (0, 1))
        assert "# Initial Observation\n\nYou are in the kitchen." in first
        room = "pantry" if moved else "kitchen"
        assert f"# Initial Observation\n\nYou are in the {room}." in second
        valid = lambda m: m.split("# Valid Actions\n\n", 1)[1].split("\n\n# Action Space", 1)[0]  # noqa: E731
        assert valid(second) == valid(first) and "- take knife" in valid(second)  # the kitchen's list
        assert tree.root.steps[1].call.messages[2:] == [
            {"role": "assistant", "content": replies[0]},
            {"role": "user", "content": tree.root.steps[0].observation},
        ]


def test_rubric_stage_rubrics_read_the_textworld_tool_list():
    """Ledgered deviation (textworld_sync.md, "the child's tools"): public Rubric-stage group rubrics pass
    TextCraft's tool string ("get_info, view_inventory, craft, finish, launch_subagent",
    rubric_generation.py) also for TextWorld; ours keeps the TextWorld list in every stage, the counterfactual
    (Rubric-stage) launch included, and shows the child's budget as asked (30, uncapped in training)."""
    from common.agent.runtime import RuntimeConfig, run_root
    from common.policy.scripted import ReplayPolicy

    acts = [
        '<delegate>{"goal": "Prepare and eat dish_1", "max_steps": 30}</delegate>',
        "<finish>a</finish>",
        "<finish>b</finish>",
        "<finish>stop</finish>",
    ]
    policy = ReplayPolicy({"act": acts, "*": ["not a rubric"] * 4})
    cfg = RuntimeConfig(max_steps=5, counterfactual_k=2, use_rubrics=True)
    tree = asyncio.run(run_root(make_task(TWO), TRAIN, policy, cfg))
    head = tree.nodes["0.1"]
    assert head.branch_group and head.rubric_call is not None
    user = head.rubric_call.messages[-1]["content"]
    tools = user.split("[Child Tools]\n", 1)[1].split("\n\n", 1)[0]
    assert tools == '"TextWorld environment actions, inventory lookup, finish, and launch_subagent"'
    assert head.max_steps == 30
    # the collector's report as the parent's line (public _child_result_summary over it, stripped)
    assert tree.root.steps[0].observation.startswith(
        "[Step 0 Observation]\n[SubAgent Results]\n- SubAgent 0: a\n\nSelected branch: 0; counterfactual "
        "branches collected: 2.\n\nValid Actions: "
    )


class _DelegatesOnce:
    """A policy: every agent's first act call delegates ``n`` goals in one ``<delegate>`` block, its second
    finishes; rubric and score calls are valid JSON."""

    def __init__(self, n: int = 1):
        from common.policy.scripted import rubric_json, score_json

        self.n, self.rubric, self.score = n, rubric_json("goal"), score_json
        self.name, self.trainable = "delegates-once", False

    async def generate(self, request):
        from common.policy.base import Completion

        if request.role == "rubric":
            text = self.rubric
        elif request.role == "score":
            text = self.score(bool(request.meta.get("child_success")))
        elif request.meta["step"] == 0:
            goals = [{"goal": "Prepare and eat dish_1", "max_steps": 2} for _ in range(self.n)]
            text = f"<delegate>{json.dumps({'delegations': goals})}</delegate>"
        else:
            text = "<finish>done</finish>"
        return Completion(text=text, prompt_ids=[1], output_ids=[2], logprobs=[-0.1])

    async def aclose(self):
        pass


def test_rubric_stage_runtime_refusals_follow_the_branch_the_agent_runs_under():
    """The runtime's ``--max-depth`` (1) refuses the depth-1 agents' launches. Under a counterfactual branch
    at that depth (environment budget 16, K=2: the root's launch forms a group) it is the public collector's
    text; for ordinary children (budget 1: no group forms) it is the step-budget tracker's, as public
    ``launch_subagent_default`` (audit 2026-12-06 N3)."""
    from common.agent.runtime import RuntimeConfig, run_root

    collector = "- SubAgent 0: Cannot launch subagent beyond max_subagent_depth=1."
    tracker = "- SubAgent 0: Not enough budget to launch subagent for goal Prepare and eat dish_1."
    for budget, branch in ((16, True), (1, False)):
        cfg = RuntimeConfig(
            max_steps=4, max_depth=1, temperature=0.0, counterfactual_k=2, max_envs_per_rollout=budget
        )
        tree = asyncio.run(run_root(make_task(TWO), TRAIN, _DelegatesOnce(), cfg))
        kids = [n for n in tree.nodes.values() if n.depth == 1]
        assert kids and all((n.branch_group is not None) == branch for n in kids)
        for n in kids:
            seen = n.steps[0].observation
            assert n.steps[0].refused_launches == 1
            assert (collector in seen, tracker in seen) == (branch, not branch), seen


@pytest.mark.parametrize("bounds, ran", [((10, 200), 10), ((0, 0), 12)])
def test_textworld_launch_bounds_default_and_paper(bounds, ran):
    """One ``<delegate>`` block with 12 delegations. Public TextWorld gathers every one (no bound: what
    ``--paper`` sets, ``0``); the default profile's ``--max-launches-per-step 10`` runs 10 and refuses 2 with
    ``launch_limit.txt`` (ours, listed in the run's departures; audit 2026-12-06 N4)."""
    from dataclasses import replace

    from common.agent.runtime import RuntimeConfig, run_root

    per_step, per_tree = bounds
    cfg = RuntimeConfig(max_steps=3, max_depth=1, temperature=0.0)
    cfg = replace(cfg, max_launches_per_step=per_step, max_agents_per_tree=per_tree)
    tree = asyncio.run(run_root(make_task(TWO), TRAIN, _DelegatesOnce(12), cfg))
    assert len([n for n in tree.nodes.values() if n.depth == 1]) == ran
    step = tree.root.steps[0]
    assert step.refused_launches == 12 - ran
    refused = "Launch refused: this agent already launched 10 sub-agents in this step"
    assert (refused in step.observation) == (ran < 12)
