"""A real SmolLM2-135M rollout on CPU: the tree finishes and every token record is exact."""

from __future__ import annotations

import asyncio

import pytest

from common.agent.runtime import run_root
from common.envs import make_env
from common.envs.textcraft.tasks import generate_tasks
from common.run.rollout import runtime_config_for


@pytest.fixture(scope="module")
def smollm2():
    from common.policy.hf import HFPolicy

    return HFPolicy("smollm2", dtype="float32", device="cpu", seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("env_name", ["textcraft", "textworld"])
def test_smollm2_rollout_records_are_token_exact(smollm2, env_name):
    if env_name == "textcraft":
        task = generate_tasks("train", 1, seed=0, difficulty="easy")[0]
    else:
        from common.envs.textworld_sync.tasks import generate_tasks as tw

        task = tw("train", 1, seed=0, tier="easy")[0]
    cfg = runtime_config_for(
        env_name,
        max_steps=2,
        max_new_tokens=40,
        temperature=1.0,
        seed=3,
        rubric_max_new_tokens=40,
        score_max_new_tokens=40,
    )
    tree = asyncio.run(run_root(task, make_env(env_name), smollm2, cfg))
    root = tree.root
    assert root.error is None and 1 <= root.steps_used <= 2  # the tree finished (finish or budget)
    tok = smollm2.tokenizer
    calls = [s.call for n in tree.nodes.values() for s in n.steps]
    calls += [c for n in tree.nodes.values() for c in (n.rubric_call, n.score_call) if c]
    assert calls
    for call in calls:
        assert 0 < len(call.output_ids) <= 40 and len(call.logprobs) == len(call.output_ids)
        assert all(lp <= 0.0 for lp in call.logprobs)
        # the recorded text is exactly the decoded output tokens (up to a stop string cut)
        decoded = tok.decode(call.output_ids, skip_special_tokens=True)
        assert decoded.startswith(call.text) or call.text.startswith(decoded.rstrip())
        # the prompt ids are the chat template of the recorded messages
        prompt = tok.decode(call.prompt_ids)
        assert call.messages[0]["content"][:200] in prompt and "<|im_start|>assistant" in prompt[-40:]
    # behaviour log-probs equal the model's teacher-forced log-probs of the same tokens (fp32: KV cache vs full pass)
    first = calls[0]
    forced = smollm2.score_logprobs(first.prompt_ids, first.output_ids)
    assert max(abs(a - b) for a, b in zip(forced, first.logprobs, strict=True)) < 1e-3
