"""Judge verdicts (common/agent/judge.py): an unparseable verdict is "no verdict" (None), never a failure;
the runtime stores RAO children's verdicts so ``--judge`` sets their execution reward.

Run: pytest tests/test_rl_judge.py
"""

from __future__ import annotations

import asyncio

import pytest

from common.agent.judge import make_judge, model_judge, parse_verdict
from common.agent.runtime import programmatic_judge
from common.agent.tree import Node
from common.policy.base import Completion


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ('{"success": true, "reason": "done"}', True),
        ('{"success": false, "reason": "half"}', False),
        ('Verdict: {"success": true}\n', True),
        ("yes", None),
        ("", None),
        ('{"success": "true"}', None),  # not a JSON boolean
        ('{"success": tru', None),  # broken JSON
        ('{"reason": "no field"}', None),
    ],
)
def test_parse_verdict(text, want):
    assert parse_verdict(text) is want


class _Says:
    """A policy stub that answers every request with a fixed text."""

    def __init__(self, text: str):
        self.text = text

    async def generate(self, request):
        return Completion(text=self.text, prompt_ids=[1], output_ids=[2], logprobs=[-0.1])


class _World:
    def describe(self) -> str:
        return "inventory: 1 stick"


class _Session:
    def success(self) -> bool:
        return True


class _Request:
    goal = "craft 1 stick"


def _run(judge):
    node = Node("0.1", "0", 1, 0, "craft 1 stick", 5)
    return asyncio.run(judge(_Request(), node, _Session(), _World()))


def test_model_judge_returns_none_on_garbage_and_the_verdict_otherwise():
    assert _run(model_judge(_Says("I think it worked"))) is None  # dropped, not a failure
    assert _run(model_judge(_Says('{"success": false}'))) is False
    assert _run(model_judge(_Says('{"success": true}'))) is True
    assert make_judge("programmatic") is programmatic_judge
    with pytest.raises(ValueError):
        make_judge("policy")  # needs the policy
    with pytest.raises(ValueError):
        make_judge("oracle")


class _Oracle:
    """The scripted TextCraft oracle (delegating) as a token-exact policy; counts judge calls."""

    def __init__(self):
        from common.envs.textcraft.oracle import oracle_reply

        self.reply, self.judge_calls = oracle_reply, 0

    async def generate(self, request):
        if request.role == "score":  # model_judge asks with role "score"
            self.judge_calls += 1
            return Completion(text="no idea", prompt_ids=[1], output_ids=[2], logprobs=[-0.1])
        text = self.reply(request.session, delegate=True, max_delegation_depth=1)
        return Completion(text=text, prompt_ids=[1], output_ids=[2, 3], logprobs=[-0.1, -0.2])


@pytest.mark.parametrize("verdict", [True, False, None])
def test_rao_runtime_stores_judge_verdicts_and_the_batch_uses_them(verdict):
    from common.agent.runtime import RuntimeConfig, run_root
    from common.envs import make_env
    from common.envs.textcraft.tasks import generate_tasks
    from common.rl.batch import build_stage_batch

    async def judge(request, node, session, world):
        return verdict

    task = generate_tasks("train", 1, seed=4, difficulty="easy")[0]
    cfg = RuntimeConfig(use_rubrics=False, max_depth=1, counterfactual_k=1)  # RAO: one child per launch
    tree = asyncio.run(run_root(task, make_env("textcraft"), _Oracle(), cfg, judge=judge))
    children = [n for n in tree.committed_nodes() if n.parent_id is not None]
    assert children and all(n.success for n in children)  # the programmatic check says success
    assert tree.meta["judged_children"] and all(n.branch_label is verdict for n in children)
    b = build_stage_batch("execution", [[tree]], execution_reward="binary", zero_variance="keep")
    child_datums = [d for d in b.datums if d.depth == 1]
    # one rollout: LOO baseline = its own R = 1 -> advantage = verdict - 1 (dropped when no verdict)
    if verdict is None:
        assert not child_datums and b.counts["dropped_children"] == len(children)
    else:
        assert child_datums and b.counts["dropped_children"] == 0
    # the programmatic judge (the default) asks nobody and marks nothing
    tree = asyncio.run(run_root(task, make_env("textcraft"), _Oracle(), cfg))
    assert "judged_children" not in tree.meta
    assert all(n.branch_label is None for n in tree.committed_nodes())
