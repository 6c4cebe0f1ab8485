"""Tests of the TextCraft-Synth CodeAct sessions: tools in the namespace, finish/success rules, the
launch_subagent injection point (argument errors, report text, refusals, un-awaited launches), shared
world vs fork for children, malformed replies and budgets.

Run: ``pytest tests/test_textcraft_env.py -q`` (about 5 s: each session forks a worker process).
"""

from __future__ import annotations

import asyncio

import pytest

from common.envs.base import ChildResult, LaunchRequest
from common.envs.textcraft import prompts
from common.envs.textcraft.env import TextCraftEnv, TextCraftSession, echo_launch_hook

TABLE = {
    "recipes": {
        "plank": {"ingredients": {"log": 1}, "result_count": 4},
        "stick": {"ingredients": {"plank": 2}, "result_count": 4},
        "torch": {"ingredients": {"stick": 1, "coal": 1}, "result_count": 1},
    }
}
TASK = {
    "id": "t-1",
    "goal": "Craft the following items: 2x torch",
    "max_steps": 20,
    "misc": {"target_items": {"torch": 2}, "initial_inventory": {"log": 3, "coal": 2}, "recipes": TABLE},
}
SOLVE = (
    'craft({"log": 1}, ("plank", 4))\n'
    'craft({"plank": 2}, ("stick", 4))\n'
    'print(craft({"stick": 2, "coal": 2}, ("torch", 2)))\n'
)


def reply(code: str, thought: str = "go") -> str:
    return f"<thought>{thought}</thought>\n<python>\n{code}\n</python>"


def run(coro):
    return asyncio.run(coro)


class Recorder:
    """A launch hook that records requests and answers with a canned ChildResult."""

    def __init__(self, **result):
        self.requests: list[LaunchRequest] = []
        self.result = result

    async def __call__(self, request: LaunchRequest) -> ChildResult:
        self.requests.append(request)
        return ChildResult(request=request, **self.result)


def root(hook=echo_launch_hook, env=None) -> TextCraftSession:
    env = env or TextCraftEnv()
    return env.root_session(env.make_world(TASK), TASK, hook)


def test_prompts_follow_the_public_structure_and_state_the_enforced_budget():
    s = root(env=TextCraftEnv(max_steps=7))
    sp = s.system_prompt()
    for needle in ("<thought>", "<python>", "on top of what you hold", "sub-agents"):
        assert needle in sp, needle
    # the depth-aware prompt's <TIPS> block: crafting and delegation strategy, launches without a budget
    assert sp.index("<TIPS>\nCRAFTING STRATEGY:") < sp.index("DELEGATION STRATEGY:") < sp.index("</TIPS>")
    assert 'await launch_subagent({"item": 1})' in sp and "steps" not in sp.split("</TIPS>")[0]
    fm = s.first_user_message()
    assert fm.startswith("# Task\n\nYour Goal: Craft the following items: 2x torch\n")
    assert "Budget: You have a total budget of 7 steps to complete this task." in fm
    for needle in (
        "# Action Space",
        "def craft(",
        "def get_info(",
        "def view_inventory(",
        "def finish(",
        'async def launch_subagent(targets: dict, context: str = "")',
        "asyncio.gather",
        "**Do not forget to await**",
    ):
        assert needle in fm, needle
    assert "log" not in fm  # as in the paper, the inventory is looked up, not given
    env = TextCraftEnv()
    world = env.make_world(TASK)
    req = LaunchRequest(
        goal="Craft the following items: 4x plank", targets={"plank": 4}, max_steps=9, context="for torches"
    )
    child = env.child_session(world, s, req, "c1", echo_launch_hook)
    cm = child.first_user_message()
    assert (
        "Your Goal: Craft the following items: 4x plank\n\nContext provided from parent agent: for torches"
        in cm
    )
    assert "total budget of 9 steps" in cm
    assert child.visible_state() == {"inventory": {"coal": 2, "log": 3}}
    s.close()
    child.close()


def test_user_prompt_directory_replaces_templates_and_bad_placeholders_name_the_line(tmp_path):
    (tmp_path / "textcraft_task.txt").write_text("GOAL=${goal} STEPS=${max_steps}\n")
    env = TextCraftEnv(prompts_dir=tmp_path)
    s = env.root_session(env.make_world(TASK), TASK, echo_launch_hook)
    assert "GOAL=Craft the following items: 2x torch STEPS=20" in s.first_user_message()
    assert s.system_prompt() == prompts.load_prompts().system(20)  # files it lacks fall back
    s.close()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "textcraft_observation.txt").write_text("[Cell ${index}]\n${stdout}\n")
    with pytest.raises(
        prompts.PromptTemplateError, match=r"textcraft_observation.txt:2: unknown placeholder \$stdout"
    ):
        TextCraftEnv(prompts_dir=bad)


def test_solve_and_finish_root_success():
    async def go():
        s = root()
        r1 = await s.step(reply(SOLVE))
        assert "Successfully crafted 2 torch(s)" in r1.observation and not r1.done
        r2 = await s.step(reply('finish("made 2 torches")'))
        assert r2.done and r2.finish_message == "made 2 torches" and s.finished
        assert s.success() and s.world.root_success()
        assert s.tool_calls["craft"] == 3 and s.tool_calls["finish"] == 1
        r3 = await s.step(reply("print(1)"))
        assert r3.done and r3.error

    run(go())


def test_namespace_persists_between_cells():
    async def go():
        s = root()
        await s.step(reply("x = view_inventory()"))
        r = await s.step(reply("print(x['log'])"))
        assert "3" in r.observation

    run(go())


def test_empty_finish_and_no_finish_are_failures():
    async def go():
        s = root()
        r = await s.step(reply(SOLVE + 'finish("")'))
        assert r.done and not s.success()  # crafted, but the finish message is empty
        env = TextCraftEnv(max_steps=2)
        s2 = root(env=env)
        await s2.step(reply(SOLVE))
        r2 = await s2.step(reply("print('still here')"))
        assert r2.done and r2.finish_message is None and not s2.success() and s2.steps_used == 2

    run(go())


def test_finish_without_crafting_fails_and_held_targets_do_not_count():
    async def go():
        task = {**TASK, "misc": {**TASK["misc"], "initial_inventory": {"log": 3, "coal": 2, "torch": 9}}}
        env = TextCraftEnv()
        s = env.root_session(env.make_world(task), task, echo_launch_hook)
        r = await s.step(reply('finish("I have torches already")'))
        assert r.done and not s.success()

    run(go())


def test_malformed_reply_costs_a_step_and_is_the_empty_cell():
    async def go():
        s = root()
        r = await s.step("I think I should craft a torch.")
        assert not r.done and s.steps_used == 1 and s.cell_index == 0
        # platoon's layout: "(No output)", the error right after it, then the next line
        assert (
            r.observation
            == "[Cell 0 Output]\n(No output)Error: No code available to execute.\nWrite your next step."
        )
        assert r.info["parse_error"] and r.info["rejected"] == "empty"
        # the slots of the observation (the error-step filter reads them): a check's message is the error
        assert (r.info["cell_output"], r.info["cell_error"]) == ("", "No code available to execute.")
        r = await s.step(reply("print(1"))
        assert r.observation.startswith(
            "[Cell 1 Output]\n(No output)Error: Execution failed. Traceback:\nSyntax error"
        )
        assert r.info["cell_output"] == "" and r.info["cell_error"].startswith("Execution failed. Traceback:")
        s.close()

    run(go())


def test_last_expression_is_echoed_and_stdlib_imports_work():
    async def go():
        s = root()
        # IPython prints "Out[1]: {...}"; SERA's vendored platoon then keeps out.split(":", 1)[1].lstrip() of
        # an output that starts with "Out[": the prompt and the blank after it go, every other colon stays
        r = await s.step(reply("import math, collections\ninv = view_inventory()\ninv"))
        assert r.observation == "[Cell 0 Output]\n{'log': 3, 'coal': 2}\n\nWrite your next step."
        assert r.info["cell_output"] == "{'log': 3, 'coal': 2}\n" and r.info["cell_error"] == ""
        r = await s.step(reply("x = math.gcd(12, 18); x;"))  # a trailing ';' does not hide it (no history)
        assert r.observation == "[Cell 1 Output]\n6\n\nWrite your next step."
        # an echoed craft() error keeps its colons (the other platoon's strip read "'Error All 1 ... Errors")
        r = await s.step(reply('craft({"log": 1}, ("plank", 3))'))
        assert r.info["cell_output"] == (
            "'Error: All 1 recipe(s) failed for plank. Errors:\\n"
            "Recipe 1: Target count 3 is not divisible by recipe result count 4'\n"
        ), r.info["cell_output"]
        # after a print the prompt stays; a long string with newlines is one repr line (not pprint's split)
        r = await s.step(reply('print("made")\ncraft({"log": 1}, ("plank", 3))'))  # no strip after a print
        assert r.info["cell_output"] == (
            "made\nOut[1]: 'Error: All 1 recipe(s) failed for plank. Errors:\\n"
            "Recipe 1: Target count 3 is not divisible by recipe result count 4'\n"
        ), r.info["cell_output"]
        s.close()

    run(go())


def test_cell_errors_are_observations_not_crashes():
    async def go():
        s = root()
        # public (IPython under platoon's ShellCapture): the traceback is stdout, i.e. the OUTPUT slot;
        # "Error: " is never added to it (audit 2026-12-04 row 4)
        r = await s.step(reply("x = 1\n1/0"))
        assert not r.done and r.error is None
        tb = (
            "-" * 75 + "\nZeroDivisionError                         Traceback (most recent call last)\n"
            "File <ipython-input-1-d9c7a350ba79>:2\n      1 x = 1\n----> 2 1/0\n\nZeroDivisionError: division by zero\n"
        )
        assert r.observation == "[Cell 0 Output]\n" + tb + "\nWrite your next step."
        assert (r.info["cell_output"], r.info["cell_error"]) == (tb, "")
        assert r.info["exception"] == "ZeroDivisionError: division by zero"
        r = await s.step(reply('print(craft("log", ("plank", 4)))'))
        assert "Error: ingredients must be a dict" in r.observation
        # stderr is the error slot (public error=cap_stderr): "(No output)Error: ..." when nothing else printed
        r = await s.step(reply('import sys\nprint("careful", file=sys.stderr)'))
        assert r.observation == "[Cell 2 Output]\n(No output)Error: careful\n\nWrite your next step."
        assert (r.info["cell_output"], r.info["cell_error"]) == ("", "careful\n")
        r = await s.step(reply('print("a")\nprint("b", file=sys.stderr)'))
        assert r.observation == "[Cell 3 Output]\na\nError: b\n\nWrite your next step."
        s.close()

    run(go())


def test_finish_returns_its_message_as_the_public_action():
    """public ``agents/actions/common.py: finish`` returns ``message``; shown when it is the last expression."""

    async def go():
        s = root()
        r = await s.step(reply('print(finish("made 2 torches"))'))
        assert r.done and r.info["cell_output"] == "made 2 torches\n"

    run(go())


def test_launch_builds_request_and_formats_report():
    async def go():
        hook = Recorder(returned=True, message="made the sticks", steps_used=3)
        s = root(hook)
        r = await s.step(reply('print(await launch_subagent({"stick": 4}, context="for torches"))'))
        (req,) = hook.requests
        assert req.goal == "Craft the following items: 4x stick"
        assert req.context == "for torches" and req.max_steps == 20 and req.targets == {"stick": 4}
        # the child's message, its budget, and the parent's own steps left (20, the current step not yet
        # counted, as the public depth-aware tracker reports it); the report ends in a newline, print adds one
        assert r.observation == (
            "[Cell 0 Output]\nmade the sticks\n\nBudget used by subagent: 3/20 steps. Total remaining budget "
            "for the current task is 20 steps.\n\n\nWrite your next step."
        )
        assert r.info["launches"] == [
            {"targets": {"stick": 4}, "error": None, "refused": False, "returned": True}
        ]
        assert s.launches[0].step == 1 and s.launches[0].result.message == "made the sticks"

    run(go())


def test_echo_hook_and_parallel_gather():
    async def go():
        s = root()
        code = (
            'rs = await asyncio.gather(launch_subagent({"stick": 4}), launch_subagent({"plank": 4}))\n'
            "for x in rs:\n    print(x)"
        )
        r = await s.step(reply(code))
        assert "(echo) Craft the following items: 4x stick" in r.observation
        assert "(echo) Craft the following items: 4x plank" in r.observation
        assert r.observation.count("Budget used by subagent: 1/20 steps") == 2

    run(go())


def test_child_that_did_not_finish_and_refusal():
    async def go():
        s = root(Recorder(returned=False, steps_used=20))
        r = await s.step(reply('print(await launch_subagent({"stick": 4}))'))
        assert "did not finish" in r.observation and "Budget used by subagent: 20/20 steps" in r.observation
        s2 = root(Recorder(returned=False, refused=True, error="Launch refused: depth limit reached."))
        r2 = await s2.step(reply('print(await launch_subagent({"stick": 4}))'))
        assert (
            "Launch refused: depth limit reached." in r2.observation and "Budget used" not in r2.observation
        )
        assert r2.info["launches"][0]["refused"] and not r2.done

    run(go())


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ('launch_subagent(["stick"])', "Error: targets must be a non-empty dict"),
        ("launch_subagent({})", "Error: targets must be a non-empty dict"),
        ('launch_subagent({"stick": 0})', "Error: count for stick must be a positive int"),
        ('launch_subagent({"stick": -2})', "Error: count for stick must be a positive int"),
        ('launch_subagent({"stick": True})', "Error: count for stick must be a positive int"),
        ('launch_subagent({"stick": "4"})', "Error: count for stick must be a positive int"),
        ('launch_subagent({"stick": 2.0})', "Error: count for stick must be a positive int"),
        ("launch_subagent({3: 1})", "Error: target item names must be non-empty strings"),
        ('launch_subagent({"stick": 4}, context=5)', "Error: context must be a string"),
    ],
)
def test_launch_argument_errors_never_reach_the_hook(call, expected):
    """The ledgered deviation (docs/fidelity/codeact.md): public platoon runs a child for any dict, but for
    these its goal string names no target (the child inherits the parent's targets) or a zero target (a
    free success), so no child runs here and the cell reads the error."""

    async def go():
        hook = Recorder(returned=True)
        s = root(hook)
        r = await s.step(reply(f"print(await {call})"))
        assert expected in r.observation and not hook.requests
        assert s.launches[0].error and s.launches[0].request is None

    run(go())


@pytest.mark.parametrize("targets", [{"gold": 1}, {"log": 1}])
def test_unknown_and_base_item_targets_run_a_child_as_the_public_code(targets):
    """Public ``launch_subagent`` runs a child for these; it fails on its own (it cannot craft them)."""

    async def go():
        hook = Recorder(returned=False, steps_used=20)
        s = root(hook)
        r = await s.step(reply(f"print(await launch_subagent({targets!r}))"))
        (req,) = hook.requests
        (item, n) = next(iter(targets.items()))
        assert req.targets == targets and req.goal == f"Craft the following items: {n}x {item}"
        assert "Budget used by subagent: 20/20 steps" in r.observation
        env = TextCraftEnv()
        world = env.make_world(TASK)
        child = env.child_session(world, s, req, "0.1", echo_launch_hook)
        await child.step(reply(f'finish("tried {item}")'))
        assert child.finished and not child.success()  # it could not craft the target
        s.close()

    run(go())


def test_depth_refusal_and_history_rebuild_use_the_templates():
    """The text ``await launch_subagent`` returns past the depth limit (public: "Not enough budget to launch
    subagent for goal G. <tracker's reason> <guidance>") and the rebuilt past reply."""
    s = root()
    req = LaunchRequest(
        goal="Craft the following items: 4x stick", targets={"stick": 4}, context="for torches"
    )
    text = s.depth_refusal(req, 3, 3)
    assert text.startswith(
        "Not enough budget to launch subagent for goal Craft the following items: 4x stick\n\n"
        "Context provided from parent agent: for torches. "
    )
    assert "depth 3" in text and "maximum depth of 3" in text
    raw = "Some preamble <thought> craft sticks </thought>\n<python>\n    x = 1\n    print(x)\n</python> trailing"
    assert s.assistant_turn(raw) == "<thought> craft sticks </thought>\n<python>x = 1\nprint(x)</python>"
    assert s.assistant_turn("no tags at all") == ""
    assert s.assistant_turn("<python>print(2)") == "<python>print(2)</python>"  # stopped at </python>
    s.close()


def test_unawaited_launch_is_rejected_before_the_cell_runs():
    async def go():
        hook = Recorder(returned=True)
        s = root(hook)
        r = await s.step(reply('craft({"log": 1}, ("plank", 4))\nx = launch_subagent({"stick": 4})'))
        assert not hook.requests and "ERROR: launch_subagent() requires 'await' to run." in r.observation
        assert r.info["rejected"] == "unawaited" and s.tool_calls["craft"] == 0
        assert s.world.inventory == {"log": 3, "coal": 2}  # nothing before the launch ran either
        # An alias escapes the static check: the coroutine is closed unrun and the note says so.
        r = await s.step(reply('f = launch_subagent\nc = f({"stick": 4})\nprint("made")'))
        assert not hook.requests and "made" in r.observation and "never awaited" in r.observation
        s.close()

    run(go())


def test_loop_detector_finishes_an_agent_that_repeats_itself():
    async def go():
        s = root()
        for i in range(3):
            r = await s.step(reply("print(view_inventory())"))
            assert not r.done, i
        r = await s.step(reply("print(view_inventory())"))
        assert (
            r.done and r.info["loop_detected"] and r.finish_message == "Stuck in a loop, terminating early."
        )
        assert s.steps_used == 5 and not s.success()  # the forced finish is a step, as in the paper
        # A period-2 pattern is a loop too; varied cells are not.
        s2 = root()
        for code in ["a = 1", "b = 2", "a = 1", "b = 2", "a = 1", "b = 2", "a = 1"]:
            r = await s2.step(reply(code))
            assert not r.done
        r = await s2.step(reply("b = 2"))
        assert r.done and r.info["loop_detected"]
        s.close()
        s2.close()

    run(go())


def test_hook_exception_ends_the_agent_with_an_error():
    async def boom(request):
        raise RuntimeError("runtime bug")

    async def go():
        s = root(boom)
        r = await s.step(reply('print(await launch_subagent({"stick": 4}))'))
        assert r.done and "runtime bug" in r.error

    run(go())


def test_children_share_the_live_world_or_a_fork():
    async def go():
        env = TextCraftEnv()
        world = env.make_world(TASK)
        parent = env.root_session(world, TASK, echo_launch_hook)
        req = LaunchRequest(goal="Craft the following items: 4x plank", targets={"plank": 4})
        child = env.child_session(world, parent, req, "c1", echo_launch_hook)
        assert child.depth == 1 and child.targets == {"plank": 4} and child.max_steps == 20
        await child.step(reply('craft({"log": 1}, ("plank", 4))\nfinish("4 planks")'))
        assert child.success() and parent.world.inventory["plank"] == 4  # the parent sees it
        # A second child must craft on top of what it finds: the parent's planks do not count.
        child2 = env.child_session(world, parent, req, "c2", echo_launch_hook)
        await child2.step(reply('finish("there are planks already")'))
        assert child2.finished and not child2.success()
        # A child on a fork is isolated until commit; goal-only requests parse their targets.
        fork = world.fork()
        req3 = LaunchRequest(goal="Craft the following items: 4x stick")
        child3 = env.child_session(fork, parent, req3, "c3", echo_launch_hook)
        assert child3.targets == {"stick": 4}
        await child3.step(reply('craft({"plank": 2}, ("stick", 4))\nfinish("sticks")'))
        assert child3.success() and "stick" not in world.inventory
        world.commit(fork)
        assert world.inventory["stick"] == 4 and "stick" in parent.world.inventory

    run(go())


def test_child_with_empty_finish_fails():
    async def go():
        env = TextCraftEnv()
        world = env.make_world(TASK)
        parent = env.root_session(world, TASK, echo_launch_hook)
        req = LaunchRequest(goal="Craft the following items: 4x plank", targets={"plank": 4})
        child = env.child_session(world, parent, req, "c1", echo_launch_hook)
        await child.step(reply('craft({"log": 1}, ("plank", 4))\nfinish("")'))
        assert child.finished and not child.success()

    run(go())


@pytest.mark.parametrize("executor", ["worker", "worker-ordered"])
def test_both_worker_modes_solve_the_task(executor):
    async def go():
        env = TextCraftEnv(executor=executor)
        s = env.root_session(env.make_world(TASK), TASK, echo_launch_hook)
        r = await s.step(reply(SOLVE))
        assert "Successfully crafted 2 torch(s)" in r.observation
        r = await s.step(reply('finish("made 2 torches")'))
        assert r.done and s.success()

    run(go())


def test_the_removed_in_process_executor_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="one of worker, worker-ordered, got 'inprocess' \\(the in-process"):
        TextCraftEnv(executor="inprocess")
