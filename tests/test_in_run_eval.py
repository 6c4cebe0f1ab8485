"""Held-out evaluation during training (``--eval-tasks FILE --eval-every N``, common/train_eval.py).

The in-run evaluation at a step must be exactly ``sera eval`` of that step's checkpoint on the same tasks:
same success, and the same trees token for token (greedy, one request per batch so no batch composition
differs). Level 1 on the tiny model, two optimizer steps (oracle-mixed rollouts so the weights move).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from common.train_config import TrainConfig


def _tasks(tmp: Path, n: int = 3) -> Path:
    from common.data import write_jsonl
    from common.envs.textcraft.tasks import generate_tasks

    path = tmp / "held_out.jsonl"
    write_jsonl(path, generate_tasks("val", n, seed=7, difficulty="easy"))
    return path


def test_eval_options_go_together():
    with pytest.raises(ValueError, match="go together"):
        TrainConfig(eval_tasks="x.jsonl")
    with pytest.raises(ValueError, match="go together"):
        TrainConfig(eval_every=5)
    with pytest.raises(ValueError, match="--eval-every must be >= 0"):
        TrainConfig(eval_tasks="x.jsonl", eval_every=-1)


@pytest.mark.slow
def test_in_run_eval_equals_sera_eval_of_the_checkpoint(tmp_path: Path):
    from common.eval import EvalConfig, evaluate, load_results
    from common.train_eval import agent_settings
    from level0_single_process.sft import export_checkpoint
    from level1_batched.train import Level1Config, train

    held_out = _tasks(tmp_path)
    cfg = TrainConfig.make(
        env="textcraft", model="tiny", out=str(tmp_path / "run"), steps=2, schedule="execution:1",
        tasks_per_step=1, rollouts_per_task=2, max_steps=2, max_new_tokens=12, oracle_mix=0.7,
        difficulty="medium", n_tasks=8, max_task_replacements=3, max_idle_rounds=4, lr=1e-3,
        eval_tasks=str(held_out), eval_every=1, codeact_executor="worker-ordered", max_batch_size=1,
    )  # fmt: skip
    train(cfg, Level1Config(), progress=False)
    run = Path(cfg.out)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/success" in r]
    assert [r["step"] for r in evals] == [0, 1, 2]  # step 0, every step, the last one once
    assert all(r["eval/n_tasks"] == 3 and "eval/success_easy" in r for r in evals)
    trained = [r for r in rows if "stage" in r]
    assert sum(not r["train/skipped"] for r in trained) == 2

    # the same tasks with `sera eval` on the exported last checkpoint
    model_dir = export_checkpoint(run, "tiny", tmp_path / "model")
    ecfg = EvalConfig(
        env="textcraft", tasks=str(held_out), policy=f"hf:{model_dir}", out=str(tmp_path / "eval"),
        concurrency=100, batch_size=1, max_steps=2, max_new_tokens=12,
    )  # fmt: skip
    report = asyncio.run(evaluate(ecfg, progress=False, agent=agent_settings(cfg)))  # the trained agent's
    assert report["success_rate"] == evals[-1]["eval/success"]
    assert (
        sorted(load_results(run / "evals" / "step_00002"))
        == sorted(load_results(tmp_path / "eval"))
        == [0, 1, 2]
    )

    def calls(directory: Path, i: int):
        rec = json.loads((directory / "results" / f"{i:05d}.json").read_text())
        return [
            (s["call"]["prompt_ids"], s["call"]["output_ids"])
            for n in rec["tree"]["nodes"].values()
            for s in n["steps"]
        ]

    mine, first = run / "evals" / "step_00002", run / "evals" / "step_00000"
    for i in range(3):
        assert calls(mine, i) == calls(tmp_path / "eval", i), f"task {i}: in-run eval and sera eval differ"
    # the step-0 evaluation saw other weights: at least one reply differs (the training moved the model)
    assert any(calls(first, i) != calls(mine, i) for i in range(3))


@pytest.mark.slow
def test_level0_logs_the_same_eval_rows(tmp_path: Path):
    """Level 0 evaluates with the same helper at the same steps (one metrics format in every tier)."""
    from level0_single_process.train import train

    cfg = TrainConfig.make(
        env="textcraft", model="tiny", out=str(tmp_path / "run"), steps=1, schedule="execution:1",
        tasks_per_step=1, rollouts_per_task=2, max_steps=2, max_new_tokens=12, oracle_mix=0.7,
        difficulty="medium", n_tasks=8, max_task_replacements=3, max_idle_rounds=4,
        eval_tasks=str(_tasks(tmp_path, 2)), eval_every=1, codeact_executor="worker-ordered",
    )  # fmt: skip
    train(cfg, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/success" in r]
    assert [(r["step"], r["eval/n_tasks"]) for r in evals] == [(0, 2), (1, 2)]
    assert (tmp_path / "run" / "evals" / "step_00001" / "report.json").exists()
