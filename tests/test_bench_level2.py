"""bench/bench_level2.py's additions for issue #22.7, on CPU.

* ``--shape tiny`` (the CPU stand-in of ``--shape qwen3-4b``): a config-only model directory with the
  dummy-weights marker; ONE colocated rank builds the trainer from random init and its engine (hf here)
  from OTHER random weights, then runs generate -> sleep -> one optimizer step -> wake -> in-process sync
  -> generate. Checked: the step trained every synthetic token, the engine's log-probs were far from the
  trainer's before the sync and equal after it (the sync, not the init, made them agree), versions, the
  engine's sleep / wake calls, the shape's parameter count, and a memory sample (resident set on CPU) for
  every phase with a peak that covers them.
* ``summary``: level 1's sync is its ``engine/update_s`` and its step ``time/round_s``; ``mem/*`` fields
  are kept as their maximum over the steps.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_summary_takes_level1_sync_and_round_time_and_the_memory_peaks(bench_module):
    h = [  # the first step is start-up: left out of the medians, not out of the memory peaks
        {"time/rollout_s": 50.0, "time/train_s": 50.0, "engine/update_s": 5.0, "time/round_s": 105.0,
         "mem/peak_gib": 9.0},
        {"time/rollout_s": 1.0, "time/train_s": 2.0, "engine/update_s": 0.25, "time/round_s": 3.25,
         "mem/peak_gib": 4.0, "train/skipped": 1.0},
        {"time/rollout_s": 3.0, "time/train_s": 2.0, "engine/update_s": 0.75, "time/round_s": 5.75,
         "mem/peak_gib": 5.0},
    ]  # fmt: skip
    s = bench_module("bench_level2").summary("level 1", h, 120.0, {"mem/torch_peak_gib": 2.0})
    assert s["time/sync_s"] == 0.5 and s["step_s"] == 4.5 and s["time/rollout_s"] == 2.0
    assert s["steps"] == 2 and s["mem/peak_gib"] == 9.0 and s["mem/torch_peak_gib"] == 2.0
    assert math.isclose(s["steps_per_s"], 1 / 4.5)


@pytest.mark.slow
def test_shape_mode_runs_one_colocated_step_on_dummy_weights(tmp_path, bench_module):
    ray = pytest.importorskip("ray", reason="level 2 needs Ray: pip install 'ray[default]'")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})  # fmt: skip
    try:
        r = bench_module("bench_level2").main(["--shape", "tiny", "--engine", "hf", "--dtype", "float32", "--shape-datums", "4",
                          "--shape-tokens", "256", "--shape-requests", "2", "--shape-new-tokens", "4",
                          "--out", str(tmp_path / "shape.json")])  # fmt: skip
    finally:
        ray.shutdown()
    assert json.loads((tmp_path / "shape.json").read_text())["peak_gib"] == r["peak_gib"]
    # the tiny Qwen3 stand-in: tied 49,152 x 128 embeddings + 2 layers of 147,840 + the final norm
    assert r["params"] == 49152 * 128 + 2 * 147840 + 128
    step = r["step"]
    assert step["train/packed_tokens"] == 4 * 256 and step["loss/tokens"] == 4 * 128
    assert math.isfinite(step["loss/cispo"]) and step["grad_norm"] > 0
    # the engine started from random weights of its own; the in-process sync gave it the trainer's
    print(f"log-prob gap engine vs trainer: {r['logprob_gap_before_sync']:.3g} before the sync, "
          f"{r['logprob_gap_after_sync']:.3g} after; peak RSS {r['peak_gib']:.2f} GiB")  # fmt: skip
    assert r["logprob_gap_before_sync"] > 0.05 and r["logprob_gap_after_sync"] < 1e-4
    assert r["generate_before"]["version"] == 0 and r["generate_after"]["version"] == 1
    assert r["generate_after"]["tokens"] == 2 * 4  # ignore_eos: every request its 4 tokens
    assert r["engine_calls"] == {"sleep": 1, "wake": 1}
    phases = ["trainer_built", "engine_started", "engine_generated", "engine_asleep", "train_step",
              "engine_woken", "engine_synced", "engine_generated_after_sync"]  # fmt: skip
    assert list(r["phases"]) == phases and r["memory_kind"] == "process RSS (GiB)"
    assert all(r["phases"][p]["rss"] > 0.05 for p in phases)
    assert r["peak_gib"] == max(r["phase_peaks"].values()) >= max(r["phases"][p]["rss"] for p in phases[:-1])
    assert step["mem/on_gpu"] == 0.0 and step["mem/train_peak_gib"] >= step["mem/asleep_gib"] - 0.01


@pytest.mark.parametrize("compiled", [False, True])
def test_both_tiers_get_the_same_trainer_settings(bench_module, compiled):
    """Level 1 compiles its layers by default on CUDA; the bench's comparison sets both tiers explicitly."""
    from types import SimpleNamespace

    b = bench_module("bench_level2")
    args = SimpleNamespace(**{
        **vars(b.parser().parse_args([])),  # every option's default, then the comparison's settings
        **dict(weight_sync="disk", batch=8, colocate=True, microbatch_tokens=32768, fast_trainer=True,
               checkpoint_fraction=0.0, compile_layers=compiled, gpu_memory_utilization=0.5),
    })  # fmt: skip
    l1 = b.level1_config(args, "vllm").resolved(cuda=True)
    l2 = b.level2_config(args, "vllm")
    assert l1.compile_layers is compiled and l2.trainer_compile_layers is compiled
    assert (l1.fast_trainer, l1.checkpoint_fraction) == (l2.trainer_fast, l2.trainer_checkpoint_fraction)
