"""Issue #49: the trainer's memory plan (common/run/trainer_memory.py), its use at level 1
(level1_batched/efficiency.py: size_trainer), and the drivers' card sizing (bench/gpu_fit.py). The GPU side
(a run's measured peak against its plan) is in bench/RESULTS.md ("Runs that fit the card")."""

from __future__ import annotations

import doctest
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from common.run.trainer_memory import (
    GIB,
    DoesNotFit,
    ModelShape,
    activation_bytes_per_token,
    gpu_memory_metrics,
    plan_trainer,
    step_bytes,
)

ROOT = Path(__file__).resolve().parents[1]
SMOL = ModelShape(layers=30, hidden=576, intermediate=1536, heads=9, kv_heads=3, head_dim=64, vocab=49152)
QWEN4B = ModelShape(layers=36, hidden=2560, intermediate=9728, heads=32, kv_heads=8, head_dim=128, vocab=151936)
N_SMOL = 134_515_008


def gpu_fit():
    spec = importlib.util.spec_from_file_location("gpu_fit", ROOT / "bench" / "gpu_fit.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("budget_gib", [6, 9.75, 16, 40, 70])
@pytest.mark.parametrize("trainable", [1_000_000, N_SMOL])  # LoRA, full fine-tuning
def test_a_plan_stays_inside_its_budget_and_prefers_no_checkpointing(budget_gib, trainable):
    p = plan_trainer(SMOL, budget_gib * GIB, N_SMOL, trainable, longest_datum=2600)
    assert p.estimate_gib <= 0.85 * budget_gib + 1e-9
    assert 2600 <= p.tokens <= 32768 and p.tokens % 1024 == 0
    # the fastest setting that fits: no checkpointing whenever rows of 8,192 tokens fit without it
    no_ckpt = step_bytes(SMOL, 8192, 0.0, N_SMOL, trainable) <= 0.85 * budget_gib * GIB
    assert p.checkpoint_fraction == (0.0 if no_ckpt else 1.0)


def test_the_issue_49_trainer_would_not_have_fit_and_now_does():
    """The H100 run of 2026-12-06: rows of 32,768 tokens without checkpointing held 22-35 GB; the estimate is
    above what was measured without checkpointing, and a 16 GiB run gets a plan that fits."""
    est = step_bytes(SMOL, 32768, 0.0, N_SMOL, 1_000_000) / GIB
    assert est >= 35.0
    with pytest.raises(DoesNotFit, match="--max-tokens-per-microbatch 32768 with --checkpoint-fraction 0"):
        plan_trainer(SMOL, 9.75 * GIB, N_SMOL, 1_000_000, tokens=32768, checkpoint_fraction=0.0)
    p = plan_trainer(SMOL, 9.75 * GIB, N_SMOL, 1_000_000, longest_datum=2600)
    assert p.estimate_gib < 9.75 and p.tokens == 32768 and p.checkpoint_fraction == 1.0


def test_a_datum_that_cannot_fit_is_refused_in_one_line():
    with pytest.raises(DoesNotFit) as e:
        plan_trainer(QWEN4B, 40 * GIB, 4_022_468_096, 4_022_468_096, longest_datum=16384)
    msg = str(e.value)
    assert "\n" not in msg and "--gpu-share" in msg and "16384 tokens" in msg


def test_a_given_row_length_is_kept_with_the_least_checkpointing_that_fits():
    p = plan_trainer(SMOL, 40 * GIB, N_SMOL, 1_000_000, tokens=16384)
    assert (p.tokens, p.checkpoint_fraction) == (16384, 0.0)
    p = plan_trainer(SMOL, 12 * GIB, N_SMOL, 1_000_000, tokens=16384)
    assert (p.tokens, p.checkpoint_fraction) == (16384, 1.0)  # too long without checkpointing: kept, checkpointed
    with pytest.raises(DoesNotFit, match="--max-tokens-per-microbatch 500000 needs"):
        plan_trainer(SMOL, 12 * GIB, N_SMOL, 1_000_000, tokens=500_000)


def test_checkpointing_shrinks_activations_and_a_given_fraction_is_kept():
    assert activation_bytes_per_token(SMOL, 1.0) < activation_bytes_per_token(SMOL, 0.5) < activation_bytes_per_token(SMOL, 0.0)
    p = plan_trainer(SMOL, 40 * GIB, N_SMOL, 1_000_000, checkpoint_fraction=0.5)
    assert p.checkpoint_fraction == 0.5 and p.estimate_gib <= 0.85 * 40


def test_size_trainer_off_cuda_keeps_the_cpu_defaults():
    from level1_batched.config import Level1Config
    from level1_batched.efficiency import size_trainer

    l1 = Level1Config(gpu_share=0.2).resolved(cuda=False)
    model = torch.nn.Linear(4, 4)
    out, plan = size_trainer(model, l1, 2600, engine=False, device=torch.device("cpu"))
    assert plan is None and out.max_tokens_per_microbatch == 2048 and out.checkpoint_fraction == 1.0
    assert gpu_memory_metrics(torch.device("cpu")) == {}


def test_gpu_fit_examples_and_its_command_line():
    mod = gpu_fit()
    assert doctest.testmod(mod).failed == 0
    ok = subprocess.run([sys.executable, "bench/gpu_fit.py", "--runs", "4", "--train", "lora"], cwd=ROOT,
                        env={"GPU_TOTAL_GIB": "79.2", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)  # fmt: skip
    assert ok.returncode == 0 and ok.stdout.strip() == "SLOTS=4 SHARE=0.202 RUN_GIB=16 CARD_GIB=79.2"
    bad = subprocess.run([sys.executable, "bench/gpu_fit.py", "--runs", "1", "--train", "full"], cwd=ROOT,
                         env={"GPU_TOTAL_GIB": "16", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "one run needs 16 GiB" in bad.stderr
    kept = subprocess.run([sys.executable, "bench/gpu_fit.py", "--runs", "4", "--train", "lora"], cwd=ROOT,
                          env={"GPU_TOTAL_GIB": "79.2", "GPU_RESERVED_GIB": "20", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True)  # fmt: skip
    assert kept.returncode == 0 and kept.stdout.startswith("SLOTS=3 SHARE=0.202 ")  # share of the whole card


# ---------------------------------------------------------------- level 2: one FSDP rank's step, checked
def _sharded_model(shape: ModelShape, n_sharded: int, n_replicated: int):
    """What rank_plan reads of a sharded model: DTensors (``to_local``; ``numel()`` = the whole tensor's) and
    plain replicated parameters, and the config."""
    from types import SimpleNamespace as NS

    config = NS(num_hidden_layers=shape.layers, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
                vocab_size=shape.vocab)  # fmt: skip
    params = [NS(numel=lambda: n_sharded, to_local=None), NS(numel=lambda: n_replicated)]
    return NS(config=config, parameters=lambda: iter(params))


def test_a_level2_rank_holds_its_shard_and_a_too_long_row_is_refused_in_one_line():
    from level2_distributed.trainer import rank_plan

    n_layers = 4_022_468_096 - 2 * QWEN4B.vocab * QWEN4B.hidden  # Qwen3-4B: decoder layers sharded, root whole
    model = _sharded_model(QWEN4B, n_layers, 2 * QWEN4B.vocab * QWEN4B.hidden)
    one = rank_plan(model, 1, 4096, 1.0, True, 2, 1000 * GIB)
    eight = rank_plan(model, 8, 4096, 1.0, True, 2, 1000 * GIB)
    # 20 bytes a sharded weight (bf16 weight + grad, fp32 master + grad, 2 AdamW moments): 7/8 of it gone
    assert one.estimate_gib - eight.estimate_gib == pytest.approx(7 / 8 * n_layers * 20 / GIB, rel=0.02)
    assert eight.tokens == 4096 and eight.checkpoint_fraction == 1.0  # the user's settings, kept
    plain = rank_plan(model, 8, 4096, 1.0, False, 2, 1000 * GIB)  # no chunked head: the row's logits at once
    assert plain.estimate_gib - eight.estimate_gib == pytest.approx((4096 - 2048) * QWEN4B.vocab * 14 / GIB)
    root = 2 * QWEN4B.vocab * QWEN4B.hidden * 20 / GIB  # the replicated root's whole state, in the estimate
    assert eight.estimate_gib > root + n_layers * 20 / 8 / GIB
    with pytest.raises(DoesNotFit) as e:  # an 80 GiB card, 8 ranks, every layer kept, 64K-token rows
        rank_plan(model, 8, 65536, 0.0, True, 2, 80 * GIB)
    msg = str(e.value)
    assert "\n" not in msg and "--trainer-microbatch-tokens 65536" in msg and "8 FSDP ranks" in msg
    assert "--max-tokens-per-microbatch" not in msg  # level 1's flag names are not level 2's


def test_level2_trainer_shares_of_the_card():
    from level2_distributed.train import trainer_gpu_share

    assert trainer_gpu_share(True, 1.0) == pytest.approx(0.7)  # beside a colocated engine (0.3 of the card)
    assert trainer_gpu_share(False, 0.5) == 0.5 and trainer_gpu_share(False, 1.0) == 1.0


def test_bench_gpu_share_runs_with_their_own_kv_cache_keep_the_trainer_part(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_gpu_share", ROOT / "bench" / "bench_gpu_share.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    assert doctest.testmod(mod).failed == 0
    with pytest.raises(ValueError, match="rao or sera"):
        mod.parse_run("grpo")
    base = mod.command("py", Path("o"), "sera", 0, 0.2, Path("t"), "", 80.0)
    more = mod.command("py", Path("o"), "sera-kv12", 0, 0.2, Path("t"), "--engine-log-stats", 80.0)
    at = lambda cmd, flag: cmd[cmd.index(flag) + 1]  # noqa: E731
    assert (at(base, "--kv-cache-gib"), at(more, "--kv-cache-gib")) == ("4", "12")
    assert float(at(more, "--gpu-share")) == pytest.approx(0.2 + 8 / 80)  # 8 GiB more KV, the same trainer part
    assert more[-1] == "--engine-log-stats"
    stale = mod.command("py", Path("o"), "rao-s1", 0, 0.2, Path("t"), "", 80.0)
    assert at(stale, "--max-staleness") == "1" and "--max-staleness" not in base
    inproc = mod.command("py", Path("o"), "rao-s1-ip", 0, 0.2, Path("t"), "", 80.0)
    assert "--no-engine-process" in inproc and "--no-engine-process" not in stale
    # the table's #53 line: an N=1 run's round against the N=0 run's rollout, each alone on the card (round 0,
    # which pays torch.compile, left out of both medians)
    runs = {"set0_1runs/0_rao": [(40, 36, 3), (20, 16, 3), (20, 16, 3)],
            "set1_1runs/0_rao-s1": [(40, 36, 3), (17.6, 17, 3), (17.6, 17, 3)],
            "set2_1runs/0_rao-s1-ip": [(40, 36, 3), (15.2, 15, 3), (15.2, 15, 3)]}  # fmt: skip
    for run, rounds in runs.items():
        (tmp_path / run).mkdir(parents=True)
        rows = [{"time/round_s": r, "time/rollout_s": ro, "time/train_s": t} for r, ro, t in rounds]
        (tmp_path / run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = mod.table(tmp_path)
    assert "rao-s1 round / rao rollout, each alone on the card: 1.10x (17.6 s / 16.0 s" in text, text
    assert "rao-s1-ip round / rao rollout, each alone on the card: 0.95x (15.2 s / 16.0 s" in text, text
    assert "rao round / rao rollout" not in text  # N=0 is the baseline, not compared with itself
    assert "CUDA MPS on" not in text
    (tmp_path / "mps.txt").write_text("MPS daemon started\n")  # gpu_share_call.sh MPS=1 marks the bench's folder
    assert "CUDA MPS on" in mod.table(tmp_path)


def test_gil_profile_shares_per_thread_and_names_what_it_left_out(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("gil_profile", ROOT / "bench" / "gil_profile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert doctest.testmod(mod).failed == 0
    raw = (
        "thread (11): rollouts-round3;run (o.py:1);collect (r.py:5) 30\n"
        "thread (12): rollouts-round4;run (o.py:1);collect (r.py:5) 10\n"  # rounds pooled: one rollouts thread
        "thread (13): MainThread;train (t.py:3);step (t.py:9) 50\n"
        "garbage line\n"
    )
    text = mod.summarize(raw, seconds=2, rate=50)
    assert "| MainThread | 0.50 | 50 | step (t.py:9) 50 |" in text
    assert "| rollouts-roundN | 0.40 | 40 | collect (r.py:5) 40 |" in text
    assert "| (no thread) | 0.10 | 10 | |" in text and "1 line(s) not in py-spy's raw format" in text
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gil_profile.py"), str(tmp_path / "none.txt"),
                        "--seconds", "1"], capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 2 and "ptrace" in r.stderr
    spy = tmp_path / "py-spy"
    spy.write_text("#!/bin/sh\n")
    monkeypatch.setenv("SPY", str(spy))
    assert mod.find_py_spy() == str(spy)  # $SPY first (the bundle's, or any the user names)


def test_bench_gpu_share_profiles_a_live_run_and_cuts_a_record_still_going(tmp_path):
    """A stand-in for py-spy (writes one sample, then sleeps as a long record would): the profile starts on
    the run's pid, is interrupted when the set ends, and its summary says what it recorded."""
    spec = importlib.util.spec_from_file_location("bench_gpu_share", ROOT / "bench" / "bench_gpu_share.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec.loader.exec_module(mod)
        fake = tmp_path / "py-spy"
        fake.write_text(
            "#!/usr/bin/env python3\nimport sys, time\nargs = sys.argv\n"
            "open(args[args.index('-o') + 1], 'w').write("
            "f'thread (1): MainThread;train (t.py:1) {50 if args[args.index(\"--pid\") + 1] == \"42\" else 0}\\n')\n"
            "time.sleep(600)\n"
        )
        fake.chmod(0o755)
        run = tmp_path / "0_rao-s1"
        run.mkdir()
        proc = mod.start_profile(str(fake), 42, run, 3, seconds=1.0)
        for _ in range(600):  # until the stand-in has written its sample (it then sleeps on: the set's end cuts it)
            if (run / "pyspy_gil_r3.txt").exists() and (run / "pyspy_gil_r3.txt").read_text().endswith("\n"):
                break
            time.sleep(0.1)
        mod.finish_profiles([(proc, run / "pyspy_gil_r3.txt", time.time() - 1.0)], seconds=1.0)
        md = (run / "pyspy_gil_r3.md").read_text()
        assert "| MainThread | 0.50 | 50 | train (t.py:1) 50 |" in md and "1.0 s recorded" in md
        assert proc.returncode is not None  # interrupted, not left behind
        assert mod.start_profile(str(tmp_path / "none"), 42, run, 4, seconds=1.0) is None  # no py-spy: no profile
        quiet = tmp_path / "quiet"
        quiet.write_text("#!/bin/sh\nexit 1\n")
        quiet.chmod(0o755)
        p2 = mod.start_profile(str(quiet), 42, run, 5, seconds=1.0)
        p2.wait()  # py-spy that could not attach exits at once
        mod.finish_profiles([(p2, run / "pyspy_gil_r5.txt", time.time())], seconds=1.0)
        assert "no profile: py-spy exited 1" in (run / "pyspy_gil_r5.md").read_text()
    finally:
        sys.path.remove(str(ROOT / "bench"))
