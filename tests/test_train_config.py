"""One source for every setting (issue #9): nested configs built from flat names, the --paper profile
applied BEFORE the user's flags, tier options rejected where they do nothing, every option reaching the
run, and bad values answered with one line before any model loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.config import build_config, flatten
from common.train_config import TrainConfig, paper_profile

ROOT = Path(__file__).resolve().parents[1]


def sera(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "sera", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def resolved(*args: str) -> dict:
    r = sera("train", *args, "--print-config")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_flat_names_reach_the_nested_configs_and_back():
    cfg = TrainConfig.make(max_steps=5, lr=1e-4, steps=3, dtype="bfloat16")
    assert (cfg.rollout.max_steps, cfg.optim.lr, cfg.steps, cfg.optim.dtype) == (5, 1e-4, 3, "bfloat16")
    assert build_config(TrainConfig, **flatten(cfg)) == cfg
    with pytest.raises(TypeError, match="max_stpes"):
        TrainConfig.make(max_stpes=3)


def test_paper_profile_comes_from_the_environment_caps():
    from common.policy.context import PAPER_CAPS

    tc, tw = paper_profile("textcraft"), paper_profile("textworld")
    assert tc["max_prompt_tokens"] == PAPER_CAPS["textcraft"].train_max_prompt_tokens
    assert (tc["steps"], tw["steps"], tw["max_new_tokens"]) == (250, 400, 3072)


def test_paper_fills_defaults_before_the_users_flags():
    cfg = resolved("--paper", "--steps", "2")
    assert cfg["steps"] == 2  # the user's flag wins over the profile's 250
    assert cfg["tasks_per_step"] == 8 and cfg["rollout"]["counterfactual_k"] == 8
    assert cfg["optim"]["dtype"] == "bfloat16" and cfg["rollout"]["max_steps"] == 20
    tw = resolved("--paper", "--env", "textworld", "--max-steps", "7")
    assert tw["steps"] == 400 and tw["rollout"]["max_new_tokens"] == 3072 and tw["rollout"]["max_steps"] == 7
    plain = resolved()
    assert plain["steps"] == 2 and plain["rollout"]["max_steps"] == 3 and plain["level"] == 0
    # the skip rule: the paper's 8 (public decide_sync_action, 8 data-parallel ranks); the laptop's 1
    assert cfg["min_trainable_datums"] == 8 and plain["min_trainable_datums"] == 1
    assert cfg["max_idle_rounds"] == 50 and plain["max_idle_rounds"] == 3  # a skipped stage is resampled
    assert resolved("--paper", "--min-trainable-datums", "3")["min_trainable_datums"] == 3


def test_level1_defaults_and_options():
    cfg = resolved("--level", "1", "--max-tokens-per-microbatch", "4096", "--max-batch-size", "4")
    assert cfg["out"] == "runs/level1" and cfg["level1"]["max_tokens_per_microbatch"] == 4096
    assert (
        cfg["max_batch_size"] == 4 and resolved("--max-batch-size", "1")["max_batch_size"] == 1
    )  # levels 0, 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-tokens-per-microbatch", "4096"], "--max-tokens-per-microbatch only apply to --level 1"),
        (["--max-batch-size", "0"], "--max-batch-size must be >= 1"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--min-trainable-datums", "0"], "--min-trainable-datums must be >= 1"),
        (["--steps", "-1"], "--steps must be >= 1"),
        (["--oracle-mix", "2"], "--oracle-mix must be in [0, 1]"),
        (["--tasks", "no/such/file.jsonl"], "does not exist"),
        (["--method", "sera2"], "sera2"),
        (["--level", "3"], "--level 3 is not available"),
    ],
)
def test_bad_train_input_is_one_line_before_any_model_loads(args: list[str], message: str):
    t0 = time.perf_counter()
    r = sera("train", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert time.perf_counter() - t0 < 60


def test_eval_batch_size_reaches_the_policy(tmp_path: Path, monkeypatch):
    """`sera eval --batch-size 64` used to be accepted and dropped; now every option reaches the run."""
    from typer.testing import CliRunner

    import common.policy
    from common.data import write_jsonl
    from common.envs.textcraft.tasks import generate_tasks
    from sera.cli import app

    tasks = tmp_path / "t.jsonl"
    write_jsonl(tasks, generate_tasks(split="val", n=1, seed=0))
    seen = {}

    def spy(spec, **kw):
        seen.update(spec=spec, **kw)
        raise ValueError("stop here")

    monkeypatch.setattr(common.policy, "make_policy", spy)
    r = CliRunner().invoke(
        app,
        [
            "eval",
            "--tasks",
            str(tasks),
            "--policy",
            "hf:tiny",
            "--out",
            str(tmp_path / "ev"),
            "--batch-size",
            "64",
        ],
    )
    assert r.exit_code == 2 and "stop here" in r.output
    assert seen["spec"] == "hf:tiny" and seen["max_batch_size"] == 64


@pytest.mark.parametrize("env", ["textcraft", "textworld"])
def test_prompts_dir_replaces_agent_and_rubric_templates(tmp_path: Path, env: str):
    """One --prompts-dir for every template: the environment's agent templates and the rubric writer's."""
    from common.agent.log import read_trees

    src = ROOT / "common" / "envs" / ("textcraft" if env == "textcraft" else "textworld_sync") / "templates"
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    name = "textcraft_system.txt" if env == "textcraft" else "system.txt"
    (prompts / name).write_text("MY-AGENT-PROMPT\n" + (src / name).read_text())
    rubric = ROOT / "common" / "agent" / "prompts" / "rubric_system.txt"
    (prompts / "rubric_system.txt").write_text("MY-RUBRIC-PROMPT\n" + rubric.read_text())
    log = tmp_path / "log.jsonl"
    r = sera(
        "rollout",
        "--env",
        env,
        "--policy",
        "oracle-delegate",
        "--log",
        str(log),
        "--prompts-dir",
        str(prompts),
        "--max-steps",
        "12",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    tree = read_trees(log)[-1]
    calls = [s.call for n in tree.nodes.values() for s in n.steps]
    assert all("MY-AGENT-PROMPT" in c.messages[0]["content"] for c in calls)
    rubric_calls = [n.rubric_call for n in tree.nodes.values() if n.rubric_call]
    assert rubric_calls, "the oracle delegates, so a rubric was written"
    assert all("MY-RUBRIC-PROMPT" in c.messages[0]["content"] for c in rubric_calls)


def test_metrics_writer_strict_json_and_tensorboard(tmp_path: Path):
    """metrics.jsonl is strict JSON (NaN -> null, read back as NaN) and --tensorboard writes event files."""
    import math

    pytest.importorskip("tensorboard", reason="the tensorboard package is an optional extra")
    from common.run.metrics import MetricsWriter, read_metrics

    w = MetricsWriter(tmp_path, tensorboard=True)
    w.write(
        {"round": 0, "step": 0, "stage": "execution", "rubric/pair_accuracy": float("nan"), "loss/cispo": 0.5}
    )
    w.close()
    line = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in line and json.loads(line)["rubric/pair_accuracy"] is None
    assert math.isnan(read_metrics(tmp_path / "metrics.jsonl")[0]["rubric/pair_accuracy"])
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def test_eval_paper_runs_the_papers_textcraft_val_set(tmp_path: Path):
    """`sera eval --paper` on TextCraft evaluates the paper's 632 val tasks (here the first 3, oracle)."""
    out = tmp_path / "ev"
    r = sera("eval", "--env", "textcraft", "--paper", "--policy", "oracle", "--out", str(out), "--limit", "3")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = (out / "paper_val.jsonl").read_text().splitlines()
    report = json.loads((out / "report.json").read_text())
    assert len(rows) == 632 and report["n_tasks"] == 3 and report["success_rate"] == 1.0


def test_codeact_executor_reaches_the_textcraft_env_only():
    from common.run.rollout import make_env_with_prompts

    cfg = TrainConfig.make(codeact_executor="worker-ordered")
    assert make_env_with_prompts("textcraft", None, cfg.codeact_executor).executor == "worker-ordered"
    assert make_env_with_prompts("textcraft", None, None).executor == "worker"  # the safe default
    assert not hasattr(make_env_with_prompts("textworld", None, "worker-ordered"), "executor")
    with pytest.raises(ValueError, match="executor must be"):
        make_env_with_prompts("textcraft", None, "subprocess")
    with pytest.raises(ValueError, match="the in-process interpreter was removed"):
        make_env_with_prompts("textcraft", None, "inprocess")


def test_auto_dtype_is_bf16_only_where_the_hardware_has_it_and_never_for_the_test_models(monkeypatch):
    import common.train_config as tc

    for cuda, cpu_bf16, model, want in [
        (False, False, "smollm2", "float32"),  # a laptop without native bf16: exact fp32
        (False, True, "smollm2", "bfloat16"),  # AVX512-BF16 / AMX: ~3x faster steps
        (True, False, "smollm2", "bfloat16"),  # a GPU, as the paper
        (True, True, "tiny", "float32"),  # the random-init test models stay exact
        (True, True, "tiny-tied", "float32"),
    ]:
        monkeypatch.setattr(tc, "_cuda_available", lambda cuda=cuda: cuda)
        monkeypatch.setattr(tc, "cpu_has_native_bf16", lambda cpu_bf16=cpu_bf16: cpu_bf16)
        assert TrainConfig.make(model=model).optim.dtype == want, (cuda, cpu_bf16, model)
        assert TrainConfig.make(model=model, dtype="float32").optim.dtype == "float32"
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    assert tc.cpu_has_native_bf16() == ("avx512_bf16" in flags or "amx_bf16" in flags)
