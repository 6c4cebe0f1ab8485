"""A prompts directory holding the public code's texts gives the public rendering byte for byte (issue #20).

The directory is written here with the STRUCTURE and fixed formats of the public templates (platoon's
``user-initial`` / ``user-observation`` / ``user-next-action-str`` rendered with ``trim_blocks``, the
depth-aware ``launch_subagent`` report and refusal, the TextWorld evaluation and training builders); the long
instructions are stand-ins (``<<...>>``), since only their placement matters. Full rollouts run through the
runtime, and every message is compared with the string the public builder would produce from the same parts:
the first message (the action space ends in a newline, as the public one: 3 newlines before the next-action
line), an observation turn with output, one with no output, one whose cell raised (IPython's traceback in the
output slot, no ``Error:``), one with stderr in the error slot and an echoed value after platoon's ``Out[``
strip, the rebuilt past replies, a launch report and a depth refusal; for TextWorld, both template sets.

Run: ``pytest tests/test_public_prompt_rendering.py -q``.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from test_textcraft_env import TASK  # the same hand-made task (plank -> stick -> torch)

from common.agent.rubric import RubricContext, build_rubric_messages
from common.agent.runtime import RuntimeConfig, run_root
from common.envs.textcraft import TextCraftEnv
from common.envs.textworld_sync.tasks import load_tasks as tw_load
from common.envs.textworld_sync.tasks import normalize_row
from common.policy.scripted import ReplayPolicy
from common.run.rollout import make_env_with_prompts

SYSTEM = "<<the recursive TextCraft system prompt>>"
ACTION_SPACE = "<<the depth-aware action space>>\n"  # the public text ends in a newline (audit row 14)
NEXT_ACTION = "<<user-next-action-str>>"
GUIDANCE = "<<the tracker's guidance>>"

# Public structure, as files (each file's one final newline is dropped by the loader).
TEXTCRAFT_FILES = {
    "textcraft_system.txt": SYSTEM,
    "textcraft_task.txt": "Your Goal: ${goal}\nBudget: You have a total budget of ${max_steps} steps to complete this task.",
    "textcraft_user_initial.txt": "# Task\n\n${task}\n\n# Action Space\n\n${action_space}\n\n${next_action}",
    "textcraft_action_space.txt": ACTION_SPACE,
    "textcraft_next_action.txt": NEXT_ACTION,
    "textcraft_observation.txt": "[Cell ${index} Output]\n${output}${error}\nProvide your next action.",
    "textcraft_no_output.txt": "(No output)",
    "textcraft_error.txt": "Error: ${error}",
    "textcraft_history_thought.txt": "<thought>${thought}</thought>",
    "textcraft_history_code.txt": "<python>${code}</python>",
    # the public report ends in a newline: the file ends in two
    "textcraft_launch_report.txt": "${message}\n\nBudget used by subagent: ${used}/${budget} steps. "
    "Total remaining budget for the current task is ${remaining} steps.\n",
    "textcraft_depth_refusal.txt": "Not enough budget to launch subagent for goal ${goal}. Launching a subagent "
    "from depth ${depth} would exceed the maximum allowed depth of ${max_depth}. " + GUIDANCE,
    "textcraft_finish_recorded.txt": "${message}",  # public finish() returns its message
    "textcraft_tools_description.txt": "get_info, view_inventory, craft, finish, launch_subagent",
}


def write(directory: Path, files: dict[str, str]) -> Path:
    directory.mkdir(exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text + "\n", encoding="utf-8")
    return directory


def public_traceback(code: str, line: int, exc: str) -> str:
    """What IPython 9.4 prints to stdout (the OUTPUT slot) for a one-line cell that raises, in an agent's
    shell (every platoon shell but a process's first: ``File <ipython-input-1-<sha1[:12]>>:k``)."""
    digest = hashlib.sha1((code + "\n").encode()).hexdigest()[:12]
    name = exc.split(":", 1)[0]
    return (
        "-" * 75 + "\n" + name + "Traceback (most recent call last)".rjust(75 - len(name)) + "\n"
        f"File <ipython-input-1-{digest}>:{line}\n----> {line} {code}\n\n{exc}\n"
    )


def public_observation(index: int, output: str, error: str) -> str:
    """platoon's ``user-observation.jinja`` rendered with trim_blocks: the newline after each ``{% endif %}``
    is eaten, so the error follows the output directly."""
    return (
        f"[Cell {index} Output]\n"
        + (output or "(No output)")
        + (f"Error: {error}" if error else "")
        + ("\nProvide your next action.")
    )


def public_history(thought: str, code: str) -> str:
    """platoon's ``_format_action_for_history`` over the parsed thought and the executed (stripped) code."""
    return "\n".join(
        p for p in (thought and f"<thought>{thought}</thought>", code and f"<python>{code}</python>") if p
    )


def test_textcraft_turns_from_a_public_prompts_directory_are_byte_exact(tmp_path):
    d = write(tmp_path / "prompts", TEXTCRAFT_FILES)
    root_replies = [
        "Let me look first.\n<thought>look around</thought>\n<python>\nprint('hello')\n</python>",
        "<thought>quiet</thought>\n<python>x = 1</python>",
        "<python>print(undefined_name)</python>",
        "<python>import sys\nprint('careful', file=sys.stderr)\n{'a': 1}</python>",
        '<thought>delegate the sticks</thought>\n<python>print(await launch_subagent({"stick": 4}))',
    ]
    child_replies = [
        '<thought>go deeper</thought>\n<python>print(await launch_subagent({"plank": 4}, context="for sticks"))</python>',
        '<python>finish("done")</python>',
    ]
    policy = ReplayPolicy([*root_replies, *child_replies, '<python>finish("all")</python>'])
    env = make_env_with_prompts("textcraft", str(d))
    cfg = RuntimeConfig(max_depth=1, use_rubrics=False, prompts_dir=str(d))
    tree = asyncio.run(run_root(TASK, env, policy, cfg))
    root, child = tree.root, tree.nodes["0.1"]
    sent = root.steps[5].call.messages
    # a raising cell: IPython's traceback is the output slot, no "Error: " (audit row 4)
    traceback = public_traceback(
        "print(undefined_name)", 1, "NameError: name 'undefined_name' is not defined"
    )
    report = "done\n\nBudget used by subagent: 2/20 steps. Total remaining budget for the current task is 16 steps.\n"
    expected = [
        {"role": "system", "content": SYSTEM},
        {
            "role": "user",
            "content": "# Task\n\nYour Goal: Craft the following items: 2x torch\nBudget: You have a total budget "
            f"of 20 steps to complete this task.\n\n# Action Space\n\n{ACTION_SPACE}\n\n{NEXT_ACTION}",
        },
        {"role": "assistant", "content": public_history("look around", "print('hello')")},
        {"role": "user", "content": public_observation(0, "hello\n", "")},  # a turn with output
        {"role": "assistant", "content": public_history("quiet", "x = 1")},
        {"role": "user", "content": public_observation(1, "", "")},  # no output
        {"role": "assistant", "content": public_history("", "print(undefined_name)")},
        {"role": "user", "content": public_observation(2, traceback, "")},  # a raised exception
        {
            "role": "assistant",
            "content": public_history("", "import sys\nprint('careful', file=sys.stderr)\n{'a': 1}"),
        },
        # stderr is the error slot; the value echo "Out[1]: {'a': 1}" loses its prompt and the blank after it
        # (SERA's vendored platoon: an output that starts with "Out[" keeps out.split(":", 1)[1].lstrip())
        {"role": "user", "content": public_observation(3, "{'a': 1}\n", "careful\n")},
        {
            "role": "assistant",
            "content": public_history("delegate the sticks", 'print(await launch_subagent({"stick": 4}))'),
        },
        {"role": "user", "content": public_observation(4, report + "\n", "")},  # the launch report, printed
    ]
    assert sent == expected
    refusal = (
        "Not enough budget to launch subagent for goal Craft the following items: 4x plank\n\nContext provided "
        f"from parent agent: for sticks. Launching a subagent from depth 1 would exceed the maximum allowed depth "
        f"of 1. {GUIDANCE}"
    )
    assert child.steps[0].observation == public_observation(0, refusal + "\n", "")
    assert child.steps[0].refused_launches == 1 and tree.success is False


def test_the_rubric_writer_reads_the_short_public_tool_lists():
    """public ``stages/common.py: rubric_context`` / ``textworld_continuous_policy/adapter.py``: the tool
    names only, never the success criterion."""
    tc = make_env_with_prompts("textcraft", None)
    tw = make_env_with_prompts("textworld", None)
    assert tc.tools_description == "get_info, view_inventory, craft, finish, launch_subagent"
    assert (
        tw.tools_description == "TextWorld environment actions, inventory lookup, finish, and launch_subagent"
    )
    ctx = RubricContext(
        parent_task="Craft the following items: 2x torch",
        parent_depth=0,
        child_depth=1,
        fork_step=0,
        parent_messages=[{"role": "user", "content": "hi"}],
        parent_action="<python>await launch_subagent({'stick': 4})</python>",
        pre_call_state={"inventory": {"log": 3}},
        delegated_goal="Craft the following items: 4x stick",
        child_tools=tc.tools_description,
        child_max_steps=20,
    )
    user = build_rubric_messages(ctx)[1]["content"]
    tools = user.split("[Child Tools]\n", 1)[1].split("\n\n[Child Execution Budget]", 1)[0]
    assert tools == '"get_info, view_inventory, craft, finish, launch_subagent"'
    assert "succeeds" not in user.split("[Child Tools]", 1)[1]


def test_textcraft_tool_list_is_a_template(tmp_path):
    d = write(tmp_path, {"textcraft_tools_description.txt": "my tools"})
    assert TextCraftEnv(prompts_dir=d).tools_description == "my tools"


# ---- TextWorld-Sync: the evaluation and the training builders ------------------------------------------
TW_COMMON = {
    "delegation_strategy.txt": "<<DELEGATION STRATEGY>>\nThe maximum delegation depth is ${max_depth}; the "
    "current depth is ${depth}.\n",
    "action_space_delegate.txt": "<<AVAILABLE ACTIONS with delegate>>",
    "action_space_act.txt": "<<AVAILABLE ACTIONS>>",
    "delegation_section.txt": "# Delegation\n\n<<delegation paragraph>>\n\n",
    "subagent_note.txt": "<<sub-agent note>>\n",
    "tools_description.txt": "TextWorld environment actions, inventory lookup, finish, and launch_subagent",
}
SYS_HEAD = (
    "<<identity>>\nYou are Agent ${agent_id}.\nYour current delegation depth is ${depth} (root is depth 0).\n"
)
SYS_TAIL = (
    "<<shared world>>\n\n<TIPS>\n<<INTERACTION STRATEGY>>\n\n${delegation_strategy}</TIPS>\n\n<<one block>>"
)
EVAL_FILES = {
    "system.txt": SYS_HEAD
    + "<<decomposition>>\nBUDGET-AWARE COLLABORATION:\n<<budget paragraph>>\n"
    + SYS_TAIL,
    "initial_user.txt": "# Task\n\n${task}\n\nBudget: You have a total budget of ${agent_max_steps} steps to "
    "complete this task.\n\n# Initial Observation\n\n${observation}\n\n# Valid Actions\n\n${valid_actions}\n\n"
    "# Action Space\n\n${action_space}\n\n${delegation_section}Now provide the first action or delegation.",
    "turn.txt": "[Step ${index} Observation]\n${observation}\n\nBudget used by current Agent: ${steps_used}/"
    "${agent_max_steps} steps.\nCurrent Agent remaining budget: ${remaining_steps} steps.\n\nValid Actions: "
    "${valid_actions}\nScore: ${score}\nTask Success: ${task_success}\nTask Failure: ${task_failure}\nDone: "
    "${done}\n\n${subagent_note}Provide your next action or delegation.",
}
TRAIN_FILES = {
    "train_system.txt": SYS_HEAD + SYS_TAIL,
    "train_initial_user.txt": "# Task\n\n${task}\n\n# Initial Observation\n\n${observation}\n\n# Valid Actions\n\n"
    "${valid_actions}\n\n# Action Space\n\n${action_space}\n\n${delegation_section}Now provide the first action "
    "or delegation.",
    "train_turn.txt": "[Step ${index} Observation]\n${observation}\n\nValid Actions: ${valid_actions}\nScore: "
    "${score}\nTask Success: ${task_success}\nTask Failure: ${task_failure}\nDone: ${done}\n\n${subagent_note}"
    "Provide your next action or delegation.",
}


# The blocks each runtime builds in code, written as files (public texts, byte for byte).
EVAL_BLOCKS = {  # Evaluation/TextWorld/textworld_parallel/evaluator.py: _run_agent, _delegation_summary
    "inventory_lookup.txt": "[Inventory Lookup]\nCurrent shared inventory (visible to all Agents):\n${inventory}\n\n"
    "Current environment observation:\n${observation}",
    "delegation_results.txt": "[SubAgent Results]\n${results}\n\n[Current Environment Observation]\n${observation}",
    "subagent_result.txt": "- Agent ${agent_id}: returned=${returned}, environment_success=${environment_success}, "
    "steps=${steps}\n  Budget used by subagent: ${steps}/${max_steps} steps. Total remaining budget for this "
    "SubAgent task is ${remaining_steps} steps.\n  result: ${result}\n  final observation: ${final_observation}",
    "delegation_rejected.txt": "SubAgent delegation rejected: current depth ${depth} reached the maximum allowed "
    "depth ${max_depth}.\n${observation}",
    "fork_budget_agent.txt": "${parent_agent_id}/fork-budget-exhausted-${group}",
}
TRAIN_BLOCKS = {  # Training/runtime/textworld_continuous_policy/env.py + the launch coordinator + the tracker
    "train_inventory_lookup.txt": "[Inventory Lookup]\nCurrent shared inventory:\n${inventory}\n\n"
    "Current environment observation:\n${observation}",
    "train_delegation_results.txt": "[SubAgent Results]\n${results}",
    "train_subagent_result.txt": "- SubAgent ${index}: ${result}",
    "train_no_return.txt": "(no explicit return)",
    # the coordinator's report ends in a newline: the file ends in two
    "train_launch_report.txt": "${message}\n\nBudget used by subagent: ${used}/${budget} steps. Total remaining "
    "budget for the current task is ${remaining} steps.\n",
    "train_budget_exhausted.txt": "WARNING: Exhausted budget when running episode. Halting episode; task may be "
    "incomplete.",
    "train_depth_refusal.txt": "Not enough budget to launch subagent for goal ${goal}. Launching a subagent from "
    "depth ${depth} would exceed the maximum allowed depth of ${max_depth}. " + GUIDANCE,
}


def _valid(infos: dict) -> str:
    return "\n".join(f"- {a}" for a in infos["validActions"]) or "(none)"


def _tw_turn(i: int, text: str, infos: dict, training: bool) -> str:
    """Both builders' ``_observation_user`` (the stand-in sub-agent note included)."""
    budget = (
        ""
        if training
        else f"Budget used by current Agent: {i + 1}/20 steps.\nCurrent Agent remaining budget: {19 - i} steps.\n\n"
    )
    return (
        f"[Step {i} Observation]\n{text}\n\n{budget}Valid Actions: {_valid(infos)}\nScore: {infos['score']}\n"
        f"Task Success: {infos['tasksuccess']}\nTask Failure: {infos['taskfailure']}\nDone: {infos['done']}\n\n"
        "<<sub-agent note>>\nProvide your next action or delegation."
    )


@pytest.mark.parametrize("prompt_set", ["evaluation", "training"])
def test_textworld_turns_from_a_public_prompts_directory_are_byte_exact(tmp_path, prompt_set):
    """A root moves, looks up the inventory, delegates (asking for 30 steps) and finishes; its child finishes
    at once. Every message of the root's last call is compared with the public builder's, from a world
    replayed by hand: evaluation rebuilds "# Initial Observation" from the current observation (valid actions
    of the start), training keeps the first; the inventory and results blocks are each runtime's own."""
    d = write(tmp_path, {**TW_COMMON, **EVAL_FILES, **TRAIN_FILES, **EVAL_BLOCKS, **TRAIN_BLOCKS})
    task = tw_load("common/envs/textworld_sync/public_sample.jsonl")[0]
    env = make_env_with_prompts("textworld", str(d), prompt_set=prompt_set)
    replies = [
        "<action>go to pantry</action>",
        "<action>inventory</action>",
        '<delegate>{"goal": "Prepare and eat dish_1", "max_steps": 30}</delegate>',
        "<finish>took it</finish>",  # the child's only reply
        "<finish>stop</finish>",
    ]
    tree = asyncio.run(
        run_root(task, env, ReplayPolicy(replies), RuntimeConfig(max_steps=20, use_rubrics=False))
    )
    sent = tree.root.steps[3].call.messages
    training = prompt_set == "training"
    # the same world, replayed by hand
    world = env.make_world(task)
    row_budget = normalize_row(task)["parallelism"]["shared_environment_max_steps"]
    assert world.spec.max_steps == (100 if training else row_budget) and row_budget != 100  # public training
    obs0, infos0 = world.observe_with_infos("0")
    out = world.step("0", "go to pantry")
    obs1, infos1 = out.observation, out.infos
    world.add_agent("0.1", start_room="kitchen" if training else None)  # training: the phantom root's room
    child_obs, child_infos = world.observe_with_infos("0.1")
    obs_now, infos_now = world.observe_with_infos("0")

    strategy = "<<DELEGATION STRATEGY>>\nThe maximum delegation depth is 3; the current depth is 0.\n"
    head = "<<identity>>\nYou are Agent 0.\nYour current delegation depth is 0 (root is depth 0).\n"
    tail = f"<<shared world>>\n\n<TIPS>\n<<INTERACTION STRATEGY>>\n\n{strategy}</TIPS>\n\n<<one block>>"
    system = (
        head
        + ("" if training else "<<decomposition>>\nBUDGET-AWARE COLLABORATION:\n<<budget paragraph>>\n")
        + tail
    )
    desc = str(task.get("task_description") or task.get("goal"))
    budget = "" if training else "Budget: You have a total budget of 20 steps to complete this task.\n\n"

    def first(observation: str) -> str:
        return (
            f"# Task\n\n{desc}\n\n{budget}# Initial Observation\n\n{observation}\n\n# Valid Actions\n\n"
            f"{_valid(infos0)}\n\n# Action Space\n\n<<AVAILABLE ACTIONS with delegate>>\n\n# Delegation\n\n"
            "<<delegation paragraph>>\n\nNow provide the first action or delegation."
        )

    if training:
        lookup = f"[Inventory Lookup]\nCurrent shared inventory:\n{infos1['inventory']}\n\n"
        results = (
            "[SubAgent Results]\n- SubAgent 0: took it\n\nBudget used by subagent: 1/30 steps. Total remaining "
            "budget for the current task is 18 steps."
        )
    else:
        lookup = f"[Inventory Lookup]\nCurrent shared inventory (visible to all Agents):\n{infos1['inventory']}\n\n"
        results = (
            "[SubAgent Results]\n- Agent 0.1: returned=True, environment_success=False, steps=1\n  Budget used by "
            "subagent: 1/20 steps. Total remaining budget for this SubAgent task is 19 steps.\n  result: took it\n"
            f"  final observation: {child_obs}\n\n[Current Environment Observation]\n{obs_now}"
        )
    lookup += f"Current environment observation:\n{obs1}"
    expected = [
        {"role": "system", "content": system},
        {"role": "user", "content": first(obs0 if training else obs_now)},
        {"role": "assistant", "content": replies[0]},
        {"role": "user", "content": _tw_turn(0, obs1, infos1, training)},
        {"role": "assistant", "content": replies[1]},
        {"role": "user", "content": _tw_turn(1, lookup, infos1, training)},
        {"role": "assistant", "content": replies[2]},
        {"role": "user", "content": _tw_turn(2, results, infos_now, training)},
    ]
    assert sent == expected
    assert obs_now != obs0  # the rebuilt first message differs from the start's
    child = tree.nodes["0.1"]
    assert child.max_steps == (30 if training else 20)  # public training: the asked budget, uncapped
    assert f"# Initial Observation\n\n{child_obs}\n\n" in child.steps[0].call.messages[1]["content"]
    assert ("You are in the kitchen." if training else "You are in the pantry.") in child_obs


@pytest.mark.parametrize("prompt_set", ["evaluation", "training"])
def test_textworld_depth_limit_from_a_public_prompts_directory(tmp_path, prompt_set):
    """The delegation past the depth limit: the evaluator's rejection + observation, or (training) one
    ``- SubAgent i:`` line per launch with the tracker's depth message."""
    from common.envs.textworld_sync import TextWorldSyncEnv

    d = write(tmp_path, {**TW_COMMON, **EVAL_FILES, **TRAIN_FILES, **EVAL_BLOCKS, **TRAIN_BLOCKS})
    task = tw_load("common/envs/textworld_sync/public_sample.jsonl")[0]
    env = TextWorldSyncEnv(max_depth=0, prompts_dir=str(d), prompt_set=prompt_set)
    replies = ['<delegate>{"goal": "Prepare and eat dish_1"}</delegate>', "<action>look around</action>"]
    tree = asyncio.run(
        run_root(task, env, ReplayPolicy(replies), RuntimeConfig(max_steps=2, max_depth=0, use_rubrics=False))
    )
    turn = tree.root.steps[0].observation.split("\n\nValid Actions: ", 1)[0]
    obs = env.make_world(task).observe("0")
    if prompt_set == "training":
        assert turn == (
            "[Step 0 Observation]\n[SubAgent Results]\n- SubAgent 0: Not enough budget to launch subagent for "
            "goal Prepare and eat dish_1. Launching a subagent from depth 0 would exceed the maximum allowed "
            f"depth of 0. {GUIDANCE}"
        )
    else:
        assert turn.startswith(
            "[Step 0 Observation]\nSubAgent delegation rejected: current depth 0 reached the maximum allowed "
            f"depth 0.\n{obs}\n\nBudget used by current Agent: 1/2 steps."
        )


def test_training_rollouts_use_the_training_set_and_eval_the_evaluation_set():
    """The switch: ``make_env_with_prompts`` defaults to the training set (every training tier builds its
    environment there); ``sera eval`` and ``sera rollout`` ask for the evaluation set."""
    import inspect

    from common import eval as eval_module
    from sera import cli

    train = make_env_with_prompts("textworld", None)
    evaluation = make_env_with_prompts("textworld", None, prompt_set="evaluation")
    assert train.prompts.prompt_set == "training" and evaluation.prompts.prompt_set == "evaluation"
    task = tw_load("common/envs/textworld_sync/public_sample.jsonl")[0]
    for env, has_budget in ((train, False), (evaluation, True)):
        s = env.root_session(env.make_world(task), task, None)  # type: ignore[arg-type]
        assert ("Budget: You have a total budget of" in s.first_user_message()) is has_budget
        assert ("BUDGET-AWARE COLLABORATION:" in s.system_prompt()) is has_budget
    assert 'prompt_set="evaluation"' in inspect.getsource(eval_module.evaluate)
    assert 'prompt_set="evaluation"' in inspect.getsource(cli._rollout)
    with pytest.raises(ValueError, match="prompt_set"):
        make_env_with_prompts("textworld", None, prompt_set="test")  # type: ignore[arg-type]
