"""Tests of the supervised warm start (``common/sft``, ``level0_single_process/sft.py``): token-exact
examples (the ids an HFPolicy would send), loss only on the assistant's tokens, deterministic batches,
resume, and a model directory that loads back. Tiny model, seconds."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
import torch

from common.policy.base import GenerationRequest, SamplingParams
from common.policy.hf import HFPolicy
from common.policy.models import load_model
from common.sft.config import SFTConfig
from common.sft.data import NOISE, TEACHER, batch_at, oracle_trees, reply_ids, tree_examples
from common.train_config import laptop_rollout


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=0)


@pytest.fixture(scope="module")
def trees(tiny):
    from common.run.data import task_pool

    _, tok = tiny
    pool = task_pool("textcraft", None, 1, 0, "easy")
    return oracle_trees("textcraft", pool, tok, 8192, laptop_rollout(), seed=0, child_noise=0.5)


def test_examples_are_the_ids_hfpolicy_would_send(tiny, trees):
    model, tok = tiny
    hf = HFPolicy(model, tok, max_batch_size=1)
    checked = set()
    for tree in trees:
        for node in tree.nodes.values():
            calls = [s.call for s in node.steps] + [c for c in (node.rubric_call, node.score_call) if c]
            for call in calls:
                sp = SamplingParams(**{**call.sampling, "stop": tuple(call.sampling["stop"])})
                req = GenerationRequest(messages=call.messages, sampling=sp, role=call.role)
                row = hf._make_row(0, req)  # HFPolicy's own prompt building
                assert call.prompt_ids == row.prompt_ids
                # the reply: the text's tokens (+ EOS unless it ends in a stop string)
                assert tok.decode(call.output_ids, skip_special_tokens=True) == call.text
                ends_in_stop = any(call.text.endswith(s) for s in sp.stop)
                assert (call.output_ids[-1] == tok.eos_token_id) != ends_in_stop
                checked.add(call.role)
    assert checked == {"act", "rubric", "score"}
    # the assistant turn is opened by the prompt, so prompt + reply is the chat template of the full chat
    call = trees[0].nodes[trees[0].root_id].steps[0].call
    text = tok.apply_chat_template(
        call.messages + [{"role": "assistant", "content": call.text}], tokenize=False
    )
    assert tok.decode(call.prompt_ids + call.output_ids) in text


def test_noise_steps_are_never_examples_and_failures_are_scored(trees):
    finishes = [s.call.finish_reason for t in trees for n in t.nodes.values() for s in n.steps]
    assert NOISE in finishes and TEACHER in finishes
    ex = [e for t in trees for e in tree_examples(t)]
    noise_prompts = {
        tuple(s.call.prompt_ids)
        for t in trees
        for n in t.nodes.values()
        for s in n.steps
        if s.call.finish_reason == NOISE
    }
    assert not any(tuple(e.prompt_ids) in noise_prompts and e.role == "act" for e in ex)
    scored = [n for t in trees for n in t.nodes.values() if n.score_call is not None]
    # every score reply states the child's real outcome
    for n in scored:
        assert json.loads(n.score_call.text)["success"] == bool(n.success)
    assert {e.role for e in ex} == {"act", "rubric", "score"}
    assert [e.role for e in tree_examples(trees[0], roles=("score",))] == ["score"] * len(
        [n for n in trees[0].nodes.values() if n.score_call is not None]
    )


def test_loss_only_on_assistant_tokens(tiny, trees):
    """Changing a prompt token's target never matters; the gradient depends on reply tokens only."""
    from level0_single_process.sft import example_loss

    model, _ = tiny
    e = tree_examples(trees[0])[0]
    assert e.loss_mask == [0] * len(e.prompt_ids) + [1] * len(e.output_ids)
    nll, T, _ = example_loss(model, e)
    assert T == len(e.output_ids)
    ids = torch.tensor([e.input_ids])
    logp = torch.log_softmax(model(input_ids=ids).logits.float(), -1)[0]  # [P+T, V]
    P = len(e.prompt_ids)
    ref = -sum(logp[P - 1 + t, e.output_ids[t]] for t in range(T))
    assert torch.allclose(nll, ref, atol=1e-3, rtol=1e-4)


def test_reply_ids_eos_rule(tiny):
    _, tok = tiny
    assert reply_ids(tok, "<python>x</python>", ("</python>",), 7)[-1] != 7
    assert reply_ids(tok, "hello", (), 7)[-1] == 7


def test_batches_are_deterministic_epochs():
    a = [batch_at(10, 4, s, seed=1) for s in range(5)]
    assert a == [batch_at(10, 4, s, seed=1) for s in range(5)]
    flat = [i for b in a for i in b]
    assert sorted(flat[:10]) == list(range(10))  # one epoch = a permutation
    assert flat[:10] != list(range(10))
    assert a != [batch_at(10, 4, s, seed=2) for s in range(5)]


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="--roles"):
        SFTConfig(roles="act,judge")
    with pytest.raises(ValueError, match="--child-noise"):
        SFTConfig(child_noise=2.0)


def test_resume_equals_one_run_and_model_dir_loads(tmp_path):
    from level0_single_process.sft import sft

    kw = dict(env="textworld", model="tiny", n_tasks=1, batch_size=1, save_every=1, roles="act", lr=1e-3)
    kw.update(max_steps=2, child_noise=0.0)
    full = sft(SFTConfig.make(steps=2, out=str(tmp_path / "a"), **kw), progress=False)
    sft(SFTConfig.make(steps=1, out=str(tmp_path / "b"), **kw), progress=False)
    rest = sft(SFTConfig.make(steps=2, out=str(tmp_path / "b"), resume=True, **kw), progress=False)
    assert [m["loss/sft"] for m in rest] == pytest.approx([full[-1]["loss/sft"]], rel=1e-5)
    lines = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 1]
    model, tok = load_model(str(tmp_path / "a" / "model"))
    assert tok.chat_template and model.config.num_hidden_layers == 2
    policy = HFPolicy(str(tmp_path / "a" / "model"), dtype="float32")
    req = GenerationRequest([{"role": "user", "content": "hi"}], SamplingParams(4, temperature=0))
    assert len(asyncio.run(policy.generate(req)).output_ids) >= 1


def test_look_up_trajectories_ground_every_agent(tiny):
    """``look_up`` (the SFT default): every agent's first trained reply is the recipe walk, and the replies
    after it never name an item the agent's own observations have not shown; without it the first reply
    already crafts (what a model copies then is recipes it never saw)."""
    from common.run.data import task_pool

    _, tok = tiny
    pool = task_pool("textcraft", None, 2, 0, "easy")
    assert SFTConfig.make(out="x").look_up is True
    for look_up in (True, False):
        trees = oracle_trees("textcraft", pool, tok, 8192, laptop_rollout(), seed=0, look_up=look_up)
        assert all(t.success for t in trees)
        for t in trees:
            for n in t.nodes.values():
                first = n.steps[0].call.text
                assert ("get_info(todo)" in first) is look_up, first
                if look_up and len(n.steps) > 1:
                    seen = n.steps[0].observation
                    for s in n.steps[1:]:
                        for name in re.findall(r"\b[a-z]\d+_i\d+(?:_\d+)?\b", s.call.text):
                            assert name in seen or name in n.goal, (name, seen)


def _score_prompts(trees):
    """(child node, its score call) for every scored child."""
    return [(n, n.score_call) for t in trees for n in t.nodes.values() if n.score_call is not None]


def test_failed_children_read_like_the_oracle_and_are_labelled_failed(tiny):
    """Issue #21.4: SFT score examples teach the VERIFIED outcome, and a failure is not given away by who
    wrote it. Random-policy children announced themselves ('<thought>Random step.</thought>' in every
    failed child, in no successful one), so the SFT'd scorer learned the writer and called 358 of 359
    failed RL children (written in the oracle's style) successful. Flawed-oracle children fail in the
    oracle's own words: the same look-up cell, and false ``finish`` claims worded as the real ones."""
    from common.envs.textcraft.oracle import FLAWS
    from common.run.data import task_pool
    from common.sft.data import FlawedOracle

    _, tok = tiny
    pool = task_pool("textcraft", None, 3, 0, "easy")
    trees = oracle_trees(
        "textcraft", pool, tok, 8192, laptop_rollout(), seed=0, child_noise=0.5, look_up=True
    )
    scored = _score_prompts(trees)
    failed = [(n, c) for n, c in scored if not n.success]
    ok = [(n, c) for n, c in scored if n.success]
    assert failed and ok
    for n, c in scored:  # the target is the verified outcome (success and a zero score for a failure)
        target = json.loads(c.text)
        assert target["success"] is bool(n.success)
        assert (target["final_score"] > 0) is bool(n.success)
        assert c.finish_reason == TEACHER and not c.prompt_truncated
    oracle_thoughts = ("<thought>First I look up", "<thought>Crafting ", "<thought>All my targets")
    for n, c in failed:  # a failed child reads like the oracle: no random writer, the oracle's cells
        assert "Random step." not in c.messages[-1]["content"]
        assert "get_info(todo)" in n.steps[0].call.text
        assert all(s.call.text.startswith(oracle_thoughts) for s in n.steps), [s.call.text for s in n.steps]
    # finishing with the oracle's "Crafted ..." message no longer means success
    claims = [n for n, _ in failed if (n.finish_message or "").startswith("Crafted ")]
    assert claims and all((n.finish_message or "").startswith("Crafted ") for n, _ in ok)
    # every flaw is reachable and deterministic per (seed, agent)
    f = FlawedOracle(seed=0)
    assert {f.flaw(f"0.{i}") for i in range(1, 40)} == set(FLAWS) and f.flaw("0.3") == f.flaw("0.3")


def test_sft_score_prompt_equals_the_rubric_stage_prompt_for_the_same_child(tiny):
    """The score example of a failed child is token for token the prompt the runtime sends when the same
    child is scored as branch 0 of a Rubric-stage counterfactual group (K=4) in RL: same layout, same
    trajectory serialisation, same caps; only the target differs in origin (the verified outcome)."""
    from common.agent.runtime import run_root
    from common.envs import make_env
    from common.policy import make_policy
    from common.run.data import hash_seed, task_pool
    from common.run.rollout import stage_runtime_config
    from common.sft.data import FlawedOracle, RecordingTeacher
    from common.train_config import TrainConfig

    _, tok = tiny
    rollout = TrainConfig().rollout  # what `sera train` rolls out with (and `sera sft` by default)
    assert rollout == SFTConfig.make(out="x").rollout
    task = task_pool("textcraft", None, 1, 0, "easy")
    (sft_tree,) = oracle_trees("textcraft", task, tok, 8192, rollout, seed=0, child_noise=1.0, look_up=True)
    example = next(e for e in tree_examples(sft_tree, ("score",)) if e.node_id == "0.1")
    rcfg = stage_runtime_config("textcraft", rollout, "rubric", True, hash_seed(0, 0, 0))
    assert rcfg.counterfactual_k > 1
    teacher = make_policy("oracle", env="textcraft", delegate=True, look_up=True)
    policy = RecordingTeacher(teacher, tok, 8192, FlawedOracle(True, rcfg.seed), 1.0, rcfg.seed)
    rl_tree = asyncio.run(run_root(task[0], make_env("textcraft"), policy, rcfg))
    child = rl_tree.nodes["0.1"]
    assert child.branch_group == "g1" and child.branch_index == 0 and not child.success
    assert child.score_call.messages == sft_tree.nodes["0.1"].score_call.messages
    assert child.score_call.prompt_ids == example.prompt_ids
    assert json.loads(child.score_call.text)["success"] is False


class _GradRecorder:
    """Stands in for the optimizer: records the gradients train_step accumulated, takes no step."""

    def __init__(self, model):
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.grads: dict[str, torch.Tensor] = {}

    def zero_grad(self):
        for p in self.params.values():
            p.grad = None

    def clip_and_step(self, clip):
        self.grads = {n: p.grad.detach().clone() for n, p in self.params.items() if p.grad is not None}
        return float(torch.linalg.vector_norm(torch.stack([g.norm() for g in self.grads.values()])))


@pytest.mark.parametrize("lora", [False, True])
def test_padded_forward_passes_give_the_one_example_step(trees, lora):
    """``--forward-tokens``: examples right-padded into one forward pass give the same per-example losses,
    metrics and gradient as one example per pass (fp32, up to float rounding), with and without a LoRA
    adapter; the groups respect the token budget and keep the order."""
    from level0_single_process.sft import add_lora, forward_groups, train_step

    examples = [e for t in trees for e in tree_examples(t)][:6]
    lens = [len(e.input_ids) for e in examples]
    assert len(set(lens)) > 1  # really padded
    budget = 3 * max(lens)
    groups = forward_groups(examples, budget)
    assert [e for g in groups for e in g] == examples and any(len(g) > 1 for g in groups)
    assert all(len(g) * max(len(e.input_ids) for e in g) <= budget or len(g) == 1 for g in groups)
    assert [len(g) for g in forward_groups(examples, 0)] == [1] * len(examples)

    out = []
    for forward_tokens in (0, budget):
        torch.manual_seed(0)
        model, _ = load_model("tiny", seed=0, dtype="float32")
        cfg = SFTConfig(model="tiny", lora_rank=4 if lora else 0, forward_tokens=forward_tokens)
        if lora:
            model = add_lora(model, cfg)
        rec = _GradRecorder(model)
        out.append((train_step(model, rec, examples, cfg), rec.grads))
    (m0, g0), (m1, g1) = out
    for k in ("loss/sft", "loss/act", "sft/token_acc", "grad_norm"):
        assert m1[k] == pytest.approx(m0[k], rel=1e-5, abs=1e-7), k
    assert g0.keys() == g1.keys() and g0
    for n in g0:
        scale = float(g0[n].abs().max()) + 1e-12
        assert float((g0[n] - g1[n]).abs().max()) <= 1e-4 * scale, n  # float rounding of other shapes
