"""Issue #39, items 1-3 on CPU: what learning does is visible, LoRA RL is exact, the stability knobs work.

1. The behaviour/trainer ratio metrics (``loss/ratio_mean``, ``loss/ratio_max``, ``loss/abs_log_ratio``) from
   ``cispo_loss``, combined over calls (level 0: one per datum; level 1: one per micro-batch) to the same
   numbers; ``grad_norm/<stage>``, ``weights/max`` and ``batch/zero_adv_frac`` in every round's metrics; the
   sampled held-out pass (``--eval-samples``) and the 95 % intervals of the evaluation rows.
2. LoRA RL: on the level-0 fixture, a LoRA model (random A and B) gives the same CISPO loss as the full model
   holding the merged weights ``W + (alpha/r) B A``, and its adapter gradients are exactly the chain rule of
   the full model's weight gradient ``G``: ``dL/dB = s G A^T``, ``dL/dA = s B^T G``. A LoRA run checkpoints the
   adapter only (a few KB for tiny) and resumes to the same numbers as a run that was never stopped.
3. ``--depth-weight-cap`` (capped weights keep mean 1), ``--stage-grad-clip`` (the step's clip is the stage's),
   and every knob a run sets is listed in its ``config.json`` "departures".
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from common.rl.datums import Datum
from common.rl.loss import RatioStats, cispo_loss

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "rl_fixture.json"
STAGES = ("execution", "delegation", "rubric")


def load_stage(stage: str) -> tuple[list[Datum], list[float]]:
    st = json.loads(FIXTURE.read_text())["stages"][stage]
    return [Datum(**d) for d in st["datums"]], st["weights"]


def tiny():
    from common.policy.models import load_model

    model, _ = load_model("tiny", dtype="float32", seed=0)
    return model.train()


# ---------------------------------------------------------------------------------------------- item 1
def test_cispo_ratio_metrics_by_hand():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    behaviour = torch.tensor([[-1.0, -2.5, -9.0]])  # rho = 1, e^0.5, (padding)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    _, m = cispo_loss(logp, behaviour, torch.tensor([1.0]), mask)
    assert m["loss/ratio_mean"] == pytest.approx((1 + math.exp(0.5)) / 2)
    assert m["loss/ratio_max"] == pytest.approx(math.exp(0.5))  # the padded token (e^6) is not counted
    assert m["loss/abs_log_ratio"] == pytest.approx(0.25)


def test_ratio_stats_match_over_datums_and_microbatches(level0_on_the_fixture):
    """Level 0 (a call per datum) and level 1 (one packed call) report the same ratio metrics; on the fixture
    the behaviour log-probs are not the tiny model's, so the ratios are far from 1 and the test is not void."""
    from level1_batched.packing import accumulate_gradients_packed

    for stage in STAGES:
        datums, weights = load_stage(stage)
        l0 = level0_on_the_fixture[stage]["metrics"]
        l1 = accumulate_gradients_packed(tiny(), datums, weights, max_tokens_per_microbatch=10**9)
        for k in ("loss/ratio_mean", "loss/ratio_max", "loss/abs_log_ratio"):
            assert l1[k] == pytest.approx(l0[k], rel=1e-4), (stage, k)
        assert l0["loss/abs_log_ratio"] > 0.1
        combined = RatioStats.from_totals(
            [l1["loss/scored_tokens"], l1["loss/ratio_sum"], l1["loss/abs_log_ratio_sum"]], l1["loss/ratio_max"]
        )
        assert combined["loss/ratio_mean"] == pytest.approx(l1["loss/ratio_mean"])


def test_step_metrics_name_the_stage_norm_the_largest_weight_and_the_zero_advantage_share():
    from common.rl.batch import StageBatch
    from common.run.metrics import NO_UPDATE, step_metrics

    datums, _ = load_stage("execution")
    datums = datums[:4]
    datums[0] = Datum(**{**datums[0].__dict__, "advantage": 0.0})
    batch = StageBatch("delegation", datums, [0.5, 0.5, 0.5, 2.5])
    kw = dict(round=0, step=3, stage="delegation", trees=[], batch=batch, execution_reward="rubric",
              t_rollout=1.0, t_train=1.0, replaced=0)  # fmt: skip
    m = step_metrics(train={"grad_norm": 0.7, "train/skipped": 0.0}, **kw)
    assert m["grad_norm/delegation"] == 0.7 and "grad_norm/execution" not in m
    assert m["weights/max"] == 2.5
    trainable = [d for d in datums if d.num_trained_tokens]
    assert m["batch/zero_adv_frac"] == pytest.approx(
        sum(d.advantage == 0 for d in trainable) / len(trainable)
    )
    assert "grad_norm/delegation" not in step_metrics(train=dict(NO_UPDATE), **kw)  # no step, no norm


def test_eval_intervals_and_the_sampled_row(tmp_path: Path):
    """The sampled rate pools K samples per task: its interval is clustered by task (a task's samples are
    one unit), so K perfectly correlated samples are worth one draw each task, not K; the greedy rate stands
    alone: Wilson, not Wald (which is 0 wide at 0 and 1)."""
    from common.eval import write_json_atomic
    from common.train_eval import clustered_interval, eval_line, eval_row, sampled_row, wilson

    def write(outcomes_per_pass):
        dirs = []
        for outcomes in outcomes_per_pass:
            d = tmp_path / f"p{len(list(tmp_path.iterdir()))}"
            for i, ok in enumerate(outcomes):
                write_json_atomic(d / "results" / f"{i:05d}.json",
                                  {"index": i, "task_id": f"t{i}", "success": bool(ok), "error": None})  # fmt: skip
            dirs.append(d)
        return dirs

    row = sampled_row(write(([1, 0, 0, 1], [1, 1, 0, 0])))
    assert row["eval/sampled_success"] == pytest.approx(0.5) and row["eval/sampled_k"] == 2
    # per task 2/2, 1/2, 0/2, 1/2: CR1 variance 4/3 * (1 + 0 + 1 + 0) / 64 = 1/24 -> n_eff 0.25 * 24 = 6
    assert (row["eval/sampled_lo"], row["eval/sampled_hi"]) == pytest.approx(wilson(0.5, 6.0))
    # correlated: 8 tasks x 4 samples, each task all-or-nothing -> wider than 32 independent draws
    corr = sampled_row(write([[1, 1, 1, 0, 0, 0, 1, 0]] * 4))
    naive = wilson(0.5, 32)
    assert corr["eval/sampled_hi"] - corr["eval/sampled_lo"] > 1.5 * (naive[1] - naive[0])
    all_or_nothing = clustered_interval([(4, 4)] * 3 + [(0, 4)] * 5)  # 8 tasks x 4 samples
    assert all_or_nothing["n_eff"] == pytest.approx(7)  # G - 1 draws, not 32
    # independent samples (one per task): the clustered interval is Wilson's at about n
    ind = clustered_interval([(1, 1)] * 10 + [(0, 1)] * 30)
    assert ind["n_eff"] == pytest.approx(39)  # 40 x (G - 1) / G
    assert ind["hi"] - ind["lo"] < 1.02 * (wilson(0.25, 40)[1] - wilson(0.25, 40)[0])

    # greedy at p = 0 and p = 1 over 20 tasks: Wilson has width (Wald: 0), inside [0, 1]
    for successes in (0, 20):
        report = {"success_rate": successes / 20, "task_weighted_rate": successes / 20, "n_done": 20,
                  "n_tasks": 20, "errors": 0, "per_tier": {}, "aggregation": "task_weighted"}  # fmt: skip
        r = eval_row(report, 0, 0, 1.0)
        lo, hi = r["eval/success_lo"], r["eval/success_hi"]
        assert 0.0 <= lo <= r["eval/success"] <= hi <= 1.0 and hi - lo > 0.15
    macro = eval_row({"success_rate": 0.4, "task_weighted_rate": 0.5, "n_done": 4, "n_tasks": 4, "errors": 0,
                      "per_tier": {}, "aggregation": "macro_over_tiers"}, 0, 0, 1.0)  # fmt: skip
    assert "eval/success_lo" not in macro  # no Wilson of another rate
    line = eval_line({**r, "eval/success_easy": 1.0, **row})
    assert "success=1.000 [0.839, 1.000]" in line and "sampled=0.500 [" in line and "clustered by task" in line
    assert "easy=1.000" in line and "lo=" not in line


def test_in_run_eval_runs_greedy_and_sampled_passes(tmp_path: Path):
    """``--eval-samples 2``: the greedy pass and two sampled passes, each in its own directory, with its
    temperature and seed in its manifest, and the row's numbers recomputed from their results."""
    from common.data import write_jsonl
    from common.envs.textcraft.tasks import generate_tasks
    from common.policy import make_policy
    from common.train_config import TrainConfig
    from common.train_eval import InRunEval, per_task_success

    write_jsonl(tmp_path / "val.jsonl", generate_tasks("val", 3))
    cfg = TrainConfig.make(model="tiny", out=str(tmp_path / "run"), eval_tasks=str(tmp_path / "val.jsonl"),
                           eval_every=1, eval_samples=2, max_steps=2, max_new_tokens=8)  # fmt: skip
    policy = make_policy("oracle", env="textcraft", delegate=True)  # succeeds: a success rate to count
    row = InRunEval(cfg)(policy, 0, 0)
    evals = tmp_path / "run" / "evals"
    assert sorted(p.name for p in evals.iterdir()) == ["step_00000", "step_00000_sample_0", "step_00000_sample_1"]
    temps = {p.name: json.loads((p / "manifest.json").read_text())["protocol"] for p in evals.iterdir()}
    assert temps["step_00000"]["temperature"] == 0.0 and temps["step_00000_sample_1"]["temperature"] == 1.0
    greedy = per_task_success(evals / "step_00000")
    assert row["eval/success"] == pytest.approx(sum(greedy.values()) / 3)
    assert row["eval/sampled_k"] == 2 and 0 <= row["eval/sampled_success"] <= 1
    assert 0 <= row["eval/success_lo"] <= row["eval/success"] <= row["eval/success_hi"] <= 1
    assert row["eval/sampled_lo"] <= row["eval/sampled_success"] <= row["eval/sampled_hi"]


def test_in_run_eval_runs_the_trained_agent_and_says_so(tmp_path: Path, monkeypatch):
    """The in-run evaluation's trees run with the run's own prompt cap, deadlines and launch bounds (not
    ``sera eval``'s paper caps: prompt cap 9,728, 1,800 s / 3,600 s, 10 launches, 200 agents), the greedy and
    the sampled pass alike; each report records them and the run says so in one line before the first."""
    import common.agent.runtime as runtime
    from common.data import write_jsonl
    from common.envs.textcraft.tasks import generate_tasks
    from common.policy import make_policy
    from common.train_config import TrainConfig
    from common.train_eval import AGENT_SETTINGS, InRunEval, agent_settings

    write_jsonl(tmp_path / "val.jsonl", generate_tasks("val", 2))
    cfg = TrainConfig.make(model="tiny", out=str(tmp_path / "run"), eval_tasks=str(tmp_path / "val.jsonl"),
                           eval_every=1, eval_samples=1, max_steps=2, max_new_tokens=8, step_timeout_s=60,
                           tree_timeout_s=120, max_launches_per_step=4, max_agents_per_tree=40)  # fmt: skip
    seen = []
    real = runtime.run_root

    async def spy(task, env, policy, rcfg, *args, **kw):
        seen.append(rcfg)
        return await real(task, env, policy, rcfg, *args, **kw)

    monkeypatch.setattr(runtime, "run_root", spy)
    lines = []
    ev = InRunEval(cfg)
    ev.log_if_due(make_policy("oracle", env="textcraft", delegate=True), 0, 0, writer=type(
        "W", (), {"write": lambda self, row: None})(), log=lines.append)  # fmt: skip
    assert len(seen) == 4  # 2 tasks x (greedy + 1 sample)
    for rcfg in seen:
        assert {n: getattr(rcfg, n) for n in AGENT_SETTINGS} == {n: getattr(cfg.rollout, n) for n in AGENT_SETTINGS}
        assert (rcfg.max_prompt_tokens, rcfg.step_timeout_s, rcfg.tree_timeout_s) == (2048, 60, 120)
        assert (rcfg.max_launches_per_step, rcfg.max_agents_per_tree, rcfg.counterfactual_k) == (4, 40, 1)
    assert sorted(r.temperature for r in seen) == [0.0, 0.0, 1.0, 1.0]
    for name in ("step_00000", "step_00000_sample_0"):
        report = json.loads((tmp_path / "run" / "evals" / name / "report.json").read_text())
        assert report["agent_settings"] == agent_settings(cfg)
    assert lines[0].startswith("[eval] held-out evaluation with the trained agent's settings")
    assert "prompt cap 2048" in lines[0] and "step deadline 60 s, tree deadline 120 s" in lines[0]
    assert "launches per step 4, agents per tree 40" in lines[0] and lines[1].startswith("eval step=0")
    ev.log_if_due(None, 1, 0, writer=None, log=lines.append)  # done already: no second line, no eval
    assert len(lines) == 2


def test_a_redone_step_sets_aside_passes_of_another_agent(tmp_path: Path, capsys):
    """A resumed run redoes the evaluation of its checkpoint's step from that step's directories; ones made
    by another agent (before the in-run evaluation ran the trained agent's settings) are set aside with one
    line and evaluated again, not refused mid-run and not mixed in."""
    from common.data import write_jsonl
    from common.envs.textcraft.tasks import generate_tasks
    from common.policy import make_policy
    from common.train_config import TrainConfig
    from common.train_eval import InRunEval, agent_settings

    write_jsonl(tmp_path / "val.jsonl", generate_tasks("val", 2))
    kw = dict(model="tiny", out=str(tmp_path / "run"), eval_tasks=str(tmp_path / "val.jsonl"), eval_every=1,
              eval_samples=1, max_steps=2, max_new_tokens=8)  # fmt: skip
    policy = make_policy("oracle", env="textcraft", delegate=True)
    InRunEval(TrainConfig.make(max_prompt_tokens=1024, **kw))(policy, 0, 0)  # "another agent"
    cfg = TrainConfig.make(**kw)
    row = InRunEval(cfg)(policy, 0, 0)
    evals = tmp_path / "run" / "evals"
    assert sorted(p.name for p in evals.iterdir()) == ["step_00000", "step_00000.stale", "step_00000_sample_0",
                                                       "step_00000_sample_0.stale"]  # fmt: skip
    assert json.loads((evals / "step_00000" / "report.json").read_text())["agent_settings"] == agent_settings(cfg)
    assert json.loads((evals / "step_00000.stale" / "report.json").read_text())["agent_settings"][
        "max_prompt_tokens"] == 1024  # fmt: skip
    assert "set aside, evaluating again" in capsys.readouterr().out and row["eval/n_tasks"] == 2


def test_sampled_eval_seeds_are_distinct_across_training_seeds():
    """Every (training seed, sample) pair gets its own seed (``seed + 1 + k`` gave seed 0's sample 1 and
    seed 1's sample 0 the same one); the greedy pass keeps the training seed; the rule depends on nothing
    but the seed and k, so SERA and RAO at one training seed use the same seeds."""
    from common.train_config import TrainConfig
    from common.train_eval import eval_config

    def cfg(seed, method="sera"):
        return TrainConfig.make(model="tiny", seed=seed, method=method, eval_tasks="v.jsonl", eval_every=1)

    seeds = {(s, k): eval_config(cfg(s), 3, k).seed for s in range(8) for k in range(8)}
    assert len(set(seeds.values())) == len(seeds)
    assert eval_config(cfg(5), 3).seed == 5
    assert [eval_config(cfg(2, "rao"), 0, k).seed for k in range(3)] == [seeds[2, k] for k in range(3)]


# ---------------------------------------------------------------------------------------------- item 2
def lora_model(rank: int = 4, alpha: float = 8.0):
    from common.policy.lora import add_lora

    model = add_lora(tiny(), rank, alpha, seed=0)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)  # B = 0 at init would make the parity trivial
    return model


@pytest.mark.parametrize("stage", STAGES)
def test_lora_merged_parity_with_the_full_model(stage: str):
    from common.policy.lora import lora_scale, merged_copy_weights
    from level0_single_process.train import accumulate_gradients

    datums, weights = load_stage(stage)
    lm = lora_model()
    full = tiny()
    full.load_state_dict({k: v for k, v in merged_copy_weights(lm).items()}, strict=True)
    m_lora = accumulate_gradients(lm, datums, weights)
    m_full = accumulate_gradients(full, datums, weights)
    assert m_lora["loss/cispo"] == pytest.approx(m_full["loss/cispo"], rel=1e-5, abs=1e-8)
    assert m_lora["loss/ratio_mean"] == pytest.approx(m_full["loss/ratio_mean"], rel=1e-5)
    s = lora_scale(lm)
    full_grads = dict(full.named_parameters())
    checked = 0
    for name, module in lm.get_base_model().named_modules():
        if not hasattr(module, "lora_A") or "default" not in module.lora_A:
            continue
        g = full_grads[f"{name}.weight"].grad  # [out, in]
        a, b = module.lora_A["default"].weight, module.lora_B["default"].weight  # [r, in], [out, r]
        scale = float(g.abs().max()) * s * max(float(a.abs().max()), float(b.abs().max())) + 1e-12
        assert float((b.grad - s * g @ a.T).abs().max()) <= 1e-4 * scale, name
        assert float((a.grad - s * b.T @ g).abs().max()) <= 1e-4 * scale, name
        assert module.base_layer.weight.grad is None  # the base is frozen
        checked += 1
    assert checked == 7 * len(lm.get_base_model().model.layers)


def test_lora_run_checkpoints_the_adapter_and_resumes_exactly(tmp_path: Path):
    """A level-0 LoRA run of 2 steps, and the same run stopped after 1 step and resumed: the same metrics at
    step 1 and the same adapter at the end; the checkpoint holds only adapter tensors."""
    from common.train_config import TrainConfig
    from level0_single_process.train import train

    kw = dict(model="tiny", lora_rank=2, lr=1e-2, oracle_mix=0.5, score_noise=0.3, max_batch_size=1,
              schedule="execution:1", max_idle_rounds=4, max_steps=2, max_new_tokens=12)  # fmt: skip
    whole = train(TrainConfig.make(out=str(tmp_path / "a"), steps=2, **kw), progress=False)
    train(TrainConfig.make(out=str(tmp_path / "b"), steps=1, **kw), progress=False)
    resumed = train(TrainConfig.make(out=str(tmp_path / "b"), steps=2, resume=True, **kw), progress=False)
    trained = [r for r in whole if not r["train/skipped"]]
    assert resumed[-1]["step"] == trained[-1]["step"]
    assert resumed[-1]["loss/cispo"] == pytest.approx(trained[-1]["loss/cispo"], rel=1e-6)
    a = torch.load(sorted((tmp_path / "a" / "checkpoints").glob("step_*"))[-1] / "state.pt", weights_only=False)
    b = torch.load(sorted((tmp_path / "b" / "checkpoints").glob("step_*"))[-1] / "state.pt", weights_only=False)
    assert a["model"].keys() == b["model"].keys() and all("lora_" in k for k in a["model"])
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert any(float(v.abs().max()) > 0 for k, v in a["model"].items() if "lora_B" in k)  # it trained
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert "--lora-rank: 2 (paper: 0, every weight trains)" in config["departures"]


# ---------------------------------------------------------------------------------------------- item 3
def test_depth_weight_cap_keeps_mean_one_and_order():
    from common.rl.weights import cap_weights, depth_weights

    # the audit's batch: 160 root datums (64 roots), 180 depth-1 (90 agents), one lone depth-2 agent (3)
    depths = [0] * 160 + [1] * 180 + [2] * 3
    ids = [f"r{i % 64}" for i in range(160)] + [f"c{i % 90}" for i in range(180)] + ["d"] * 3
    w = depth_weights(depths, ids)
    assert max(w) > 40
    for cap in (1.0, 2.0, 4.0):
        c = cap_weights(w, cap)
        assert sum(c) / len(c) == pytest.approx(1.0)
        assert max(c) <= cap + 1e-9
        order = sorted(range(len(w)), key=lambda i: w[i])
        assert all(c[i] <= c[j] + 1e-12 for i, j in zip(order, order[1:], strict=False)), cap  # no weight overtakes one
    assert cap_weights(w, 0) == w
    with pytest.raises(ValueError):
        cap_weights(w, 0.5)


def test_build_stage_batch_applies_the_cap():
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from test_rl_batch import _tree

    from common.rl.batch import build_stage_batch
    from common.rl.weights import cap_weights

    # two children lose their rubric: 3 root trajectories (6 datums) and 1 child trajectory (1 datum)
    trees = [_tree(True, 0.9), _tree(False, 0.2, rubric_ok=False), _tree(False, 0.7, rubric_ok=False)]
    plain = build_stage_batch("execution", [trees], execution_reward="rubric")
    capped = build_stage_batch("execution", [trees], execution_reward="rubric", depth_weight_cap=1.5)
    assert max(plain.weights) == pytest.approx(7 / 3)  # Z = 7 / (6/3 + 1/1), w_1 = Z / 1
    assert capped.weights == cap_weights(plain.weights, 1.5)
    assert max(capped.weights) == pytest.approx(1.5) and sum(capped.weights) == pytest.approx(7)
    assert [d.advantage for d in capped.datums] == [d.advantage for d in plain.datums]


def test_stage_grad_clip_reaches_the_optimizer(monkeypatch):
    from common.rl.batch import StageBatch
    from common.run.optim import make_optimizer
    from common.train_config import OptimConfig, TrainConfig
    from level0_single_process.train import train_on_batch

    with pytest.raises(ValueError, match="stage-grad-clip"):
        OptimConfig(stage_grad_clip="delegation:-1")
    cfg = TrainConfig.make(model="tiny", stage_grad_clip="delegation:0.05", grad_clip=0.5)
    datums, weights = load_stage("delegation")
    model = tiny()
    optimizer = make_optimizer(model, cfg.optim)
    seen = []
    real = optimizer.clip_and_step
    monkeypatch.setattr(optimizer, "clip_and_step", lambda clip: seen.append(clip) or real(clip))
    for stage in ("delegation", "execution"):
        train_on_batch(model, optimizer, StageBatch(stage, datums, weights), cfg)
    assert seen == [0.05, 0.5]
