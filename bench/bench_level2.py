"""Level 2's seconds per step split into rollout / weight sync / train, next to level 1 on the same config,
with peak memory; and (``--shape``) one colocated step of a big model's shape on dummy weights, with its memory.

    python bench/bench_level2.py --model tiny --steps 3                          # CPU: 1 server + 1 trainer
    python bench/bench_level2.py --model tiny --steps 3 --trainers 2 --servers 2
    python bench/bench_level2.py --model smollm2 --steps 4 --single-node 2 --level1   # 2 GPUs vs level 1 on 1
    # one H200 (issue #22.7): colocated level 2 vs level 1, the same engine and trainer settings in one run
    python bench/bench_level2.py --model smollm2 --steps 4 --colocate --level1 --engine vllm --dtype bfloat16 \\
        --fast-trainer --checkpoint-fraction 0 --microbatch-tokens 32768 --sync-check --out l2_vs_l1.json
    # one colocated optimizer step of the Qwen3-4B shape: random weights, vLLM from load_format="dummy"
    python bench/bench_level2.py --shape qwen3-4b --engine vllm --dtype bfloat16 --out shape.json
    # split mode on ONE GPU (a trainer rank and an in-actor vLLM server at 0.5 each; disk sync, since NCCL
    # refuses a group with two ranks on one device)
    python bench/bench_level2.py --model smollm2 --steps 4 --engine vllm --dtype bfloat16 --trainer-gpus 0.5 \
        --server-gpus 0.5 --weight-sync disk --server-gpu-memory-utilization 0.3 --sync-check --out split.json
    python bench/bench_level2.py --shape tiny --engine hf --dtype float32        # its CPU stand-in

**Loop mode.** Every row is the median over the optimizer steps after the first (the first pays for start-up:
actors, model loads, the first sync). ``steps/s`` is 1 / that median step time (rollout + sync + train; level 1's
``time/round_s``, whose sync is its engine update). ``--engine`` sets both tiers' engine (level 2's colocated
engines or servers, level 1's rollout engine); ``--fast-trainer`` / ``--checkpoint-fraction`` /
``--compile-layers`` / ``--microbatch-tokens`` / ``--batch`` the same trainer and batch settings on both (the
flag overrides level 1's CUDA default of compiled layers: both tiers compile or neither does); level 1's vLLM
engine core runs in its process like a colocated rank's (``--engine-process`` moves it out). Peak memory: level 2 from the
colocated ranks' ``mem/*`` metrics (GPU: the whole device, engine awake / asleep / during the update; CPU: the
rank's resident set; servers and trainer ranks apart are not measured); level 1 from this process (GPU: the device's use sampled every 10 ms through NVML while
it ran, ``PeakPoller``, and ``torch.cuda.max_memory_allocated``; CPU: this process's lifetime peak resident
set, level 2's driver part included). The issue's goal for two GPUs: level 2 >= 1.8x level 1's steps/s.

**Shape mode** (``--shape qwen3-4b`` | ``tiny``): a model directory with only a ``config.json`` of that shape
(Qwen3-4B's: ``QWEN3_4B`` of bench/bench_train_gpu.py), SmolLM2's tokenizer (token ids < 49,152, valid in
either vocabulary; the offline GPU machine had no other) and the ``DUMMY_WEIGHTS`` marker; ONE colocated rank (a Ray actor,
the GPU) builds the trainer from random init and its engine from random weights (vLLM ``load_format="dummy"``),
then runs the loop's phases once: engine generates -> sleep -> one optimizer step on ``--shape-datums`` synthetic
datums of ``--shape-tokens`` tokens -> wake -> in-process weight sync -> generates again. After each phase the
rank's memory (GPU: the device's use, the phase's peak, the torch allocator); the teacher-forced log-prob gap
engine vs trainer before the sync (dummy vs trainer weights: large) and after (the sync worked: small).
``trainer_states_gib_expected`` = 16 bytes per parameter (fp32 weights, gradients, AdamW m and v).

What it simplifies: one seed, a small fixed config (teacher-forced oracle replies so that groups have
signal); a measurement, not a sweep. The shape step's datums are random tokens (memory and time depend on
their count and length, not on their content).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# The CPU stand-in: Qwen3's architecture (tied head), head size 64 so that vLLM's CPU attention takes it.
TINY_QWEN3 = dict(
    vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, head_dim=64, max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=1e6,
    rms_norm_eps=1e-6, attention_bias=False,
)  # fmt: skip


def shapes() -> dict[str, dict[str, Any]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_train_gpu import QWEN3_4B  # one source for the Qwen3-4B shape

    return {"qwen3-4b": QWEN3_4B, "tiny": TINY_QWEN3}


def config(args, out: str):
    from common.train_config import TrainConfig

    return TrainConfig.make(
        env="textcraft", model=args.model, out=out, steps=args.steps, schedule="execution:1",
        tasks_per_step=args.tasks, rollouts_per_task=args.rollouts, max_steps=3, max_new_tokens=args.new_tokens,
        rubric_max_new_tokens=16, oracle_mix=0.7, score_noise=0.3, difficulty="medium", n_tasks=16,
        max_task_replacements=3, max_idle_rounds=6, dtype=args.dtype, save_every=args.steps,
        max_batch_size=args.batch,  # level 1's engine batch (level 2's servers: server_batch_size)
    )  # fmt: skip


def summary(name: str, history: list[dict], wall: float, memory: dict | None = None) -> dict:
    """Medians over the steps after the first; sync = level 2's ``time/sync_s`` or level 1's
    ``engine/update_s``; step = ``time/step_s`` (level 2) or ``time/round_s`` (level 1), else rollout + train.

    >>> h = [{"time/rollout_s": 9.0, "time/train_s": 9.0, "engine/update_s": 9.0, "time/round_s": 27.0},
    ...      {"time/rollout_s": 1.0, "time/train_s": 2.0, "engine/update_s": 0.5, "time/round_s": 3.5}]
    >>> s = summary("l1", h, 30.0); (s["time/sync_s"], s["step_s"], s["steps"])
    (0.5, 3.5, 2)
    """
    rows = [h for h in history[1:]] or history

    def med(keys: tuple[str, ...], default: float = 0.0) -> float:
        vals = [next((h[k] for k in keys if k in h and not math.isnan(h[k])), default) for h in rows]
        return statistics.median(vals)

    step = med(("time/step_s", "time/round_s"), float("nan"))
    if math.isnan(step):
        step = statistics.median(h["time/rollout_s"] + h["time/train_s"] for h in rows)
    out = {
        "name": name,
        "time/rollout_s": med(("time/rollout_s",)),
        "time/sync_s": med(("time/sync_s", "engine/update_s")),
        "time/train_s": med(("time/train_s",)),
        "step_s": step,
        "steps_per_s": 1.0 / step,
        "steps": sum(1 for h in history if not h.get("train/skipped")),
        "wall": wall,
        "train_tokens_per_s": med(("train/tokens_per_s",)),
    }
    gaps = [h["sync/logprob_gap"] for h in history if "sync/logprob_gap" in h]
    if gaps:
        out["sync_logprob_gap_max"] = max(gaps)
    weight_gaps = [h["sync/weight_gap"] for h in history if "sync/weight_gap" in h]
    if weight_gaps:  # NaN where the engine's weights cannot be read: max() would drop it only by position
        out["sync_weight_gaps"] = weight_gaps
    mem = {
        k: max(h[k] for h in history if k in h)
        for k in {k for h in history for k in h if k.startswith("mem/")}
    }
    return {**out, **mem, **(memory or {})}


def gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def level2_config(args, l2_engine: str):
    from level2_distributed.config import Level2Config

    return Level2Config(
        trainers=args.trainers, servers=args.servers, single_node=args.single_node, weight_sync=args.weight_sync,
        server_batch_size=args.batch, server_engine=l2_engine, server_python=args.server_python,
        colocate=args.colocate, sync_check=args.sync_check, trainer_microbatch_tokens=args.microbatch_tokens,
        activation_checkpointing=not args.no_activation_checkpointing, trainer_fast=args.fast_trainer,
        trainer_checkpoint_fraction=args.checkpoint_fraction if args.fast_trainer else 1.0, export_hf=False,
        trainer_compile_layers=args.fast_trainer and args.compile_layers, trainer_gpus=args.trainer_gpus,
        server_gpus=args.server_gpus, server_gpu_memory_utilization=args.server_gpu_memory_utilization,
    )  # fmt: skip


def level1_config(args, engine: str):
    from level1_batched.config import Level1Config

    return Level1Config(
        max_tokens_per_microbatch=args.microbatch_tokens, engine=engine,
        engine_process=args.engine_process, gpu_memory_utilization=args.gpu_memory_utilization,
        fast_trainer=args.fast_trainer, checkpoint_fraction=args.checkpoint_fraction if args.fast_trainer else None,
        compile_layers=args.compile_layers if args.fast_trainer else None,  # explicit: level 1 compiles on CUDA by default
    )  # fmt: skip


def wait_for_gpu_release(timeout_s: float = 60.0) -> dict[str, float]:
    """GPU only: wait (at most ``timeout_s``) until no other process holds GPU memory, so that a measurement
    that starts now does not count the killed actors of the run before (their memory goes when their process
    has exited); returns the wait and the device's use then (``baseline_gib``, NVML), or {} without NVML."""
    import os

    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        t = time.perf_counter()
        while time.perf_counter() - t < timeout_s:
            others = [x for x in pynvml.nvmlDeviceGetComputeRunningProcesses(h) if x.pid != os.getpid()]
            if not others:
                break
            time.sleep(0.5)
        return {"mem/waited_s": time.perf_counter() - t,
                "mem/baseline_gib": pynvml.nvmlDeviceGetMemoryInfo(h).used / 2**30}  # fmt: skip
    except Exception:  # noqa: BLE001 - no NVML: a fixed pause
        time.sleep(5.0)
        return {}


def level1_memory(run) -> tuple[Any, dict[str, float]]:
    """Run ``run()`` (level 1, in this process) and measure its memory (see the module docstring)."""
    import torch

    from level2_distributed.colocate import PeakPoller, memory_now

    if not gpu():
        out = run()
        now = memory_now(torch.device("cpu"))
        return out, {"mem/on_gpu": 0.0, "mem/peak_gib": now["rss_peak"]}
    before = wait_for_gpu_release()  # level 2's actors were killed just before
    dev = torch.device("cuda", 0)
    torch.cuda.reset_peak_memory_stats(dev)
    with PeakPoller(dev) as poll:
        out = run()
    return out, {"mem/on_gpu": 1.0, "mem/peak_gib": poll.peak, **before,
                 "mem/torch_peak_gib": torch.cuda.max_memory_allocated(dev) / 2**30}  # fmt: skip


def write(path: str, report: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=2, default=str))


def loop_mode(args) -> dict:
    from level2_distributed.train import train as train2

    engine = args.engine or "hf"  # level 1's engine (hf: the bench's earlier default)
    if engine == "auto":
        engine = "vllm" if gpu() else "hf"
    l2_engine = args.server_engine if args.engine is None else engine
    l2 = level2_config(args, l2_engine)
    l1 = level1_config(args, engine) if args.level1 else None
    report: dict[str, Any] = {
        "mode": "loop", "model": args.model, "dtype": args.dtype, "steps": args.steps, "gpu": gpu_name(),
        "level2": {k: v for k, v in vars(l2.resolved()).items()}, "level1": vars(l1) if l1 else None, "runs": [],
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        h = train2(config(args, f"{tmp}/l2"), l2, progress=False)
        r = l2.resolved()
        kind = f"{r.trainers} colocated ranks" if r.colocate else f"{r.trainers} FSDP + {r.servers} servers"
        report["runs"].append(summary(f"level 2 ({kind}, {l2_engine})", h, time.perf_counter() - t))
        write(args.out, report)  # what exists so far
        if l1 is not None:
            from level1_batched.train import train as train1

            t = time.perf_counter()
            h, mem = level1_memory(lambda: train1(config(args, f"{tmp}/l1"), l1, progress=False))
            report["runs"].append(
                summary(f"level 1 (one process, {engine})", h, time.perf_counter() - t, mem)
            )
    print("\n| run | rollout s | sync s | train s | s/step | steps/s | optimizer steps | wall s | peak GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in report["runs"]:
        where = "GPU" if r.get("mem/on_gpu") else "RSS"
        print(f"| {r['name']} | {r['time/rollout_s']:.2f} | {r['time/sync_s']:.3f} | {r['time/train_s']:.2f} | "
              f"{r['step_s']:.2f} | {r['steps_per_s']:.3f} | {r['steps']} | {r['wall']:.0f} | "
              f"{r.get('mem/peak_gib', float('nan')):.2f} ({where}) |")  # fmt: skip
    if len(report["runs"]) == 2:
        report["level2_over_level1"] = report["runs"][0]["steps_per_s"] / report["runs"][1]["steps_per_s"]
        print(f"\nlevel 2 / level 1 steps/s: {report['level2_over_level1']:.2f}x")
    write(args.out, report)
    return report


# ----------------------------------------------------------------------------------------------------
# Shape mode: one colocated step of a big model's shape on dummy weights.
# ----------------------------------------------------------------------------------------------------
def shape_dir(shape: str, directory: Path) -> Path:
    """A config-only model directory of ``shape`` (+ SmolLM2's tokenizer + the dummy-weights marker)."""
    from transformers import Qwen3Config

    from common.policy.models import load_tokenizer
    from level2_distributed.trainer import DUMMY_WEIGHTS

    tok = load_tokenizer("smollm2")
    kw = shapes()[shape]
    if kw["vocab_size"] < len(tok):
        raise ValueError(f"shape {shape}: vocab {kw['vocab_size']} < the tokenizer's {len(tok)}")
    cfg = Qwen3Config(**kw, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)  # fmt: skip
    cfg.architectures = ["Qwen3ForCausalLM"]
    directory.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(directory)
    tok.save_pretrained(directory)
    (directory / DUMMY_WEIGHTS).write_text(json.dumps({"shape": shape, "tokenizer": "SmolLM2-135M-Instruct",
                                                       "made_by": "bench/bench_level2.py --shape"}))  # fmt: skip
    return directory


def count_params(directory: Path) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory))
    return sum(p.numel() for p in model.parameters())  # a tied head counted once


def synthetic_datums(n: int, tokens: int, vocab: int, seed: int = 0) -> list:
    """``n`` datums of ``tokens`` random ids (half prompt, half trained output), advantages +-1, behaviour
    log-probs at a uniform policy's value (importance ratios near 1 for near-uniform random weights)."""
    import random

    from common.rl.datums import Datum

    rng = random.Random(seed)
    out = []
    for j in range(n):
        ids = [rng.randrange(3, vocab) for _ in range(tokens)]
        p = tokens // 2
        o = tokens - p
        out.append(Datum(ids[:p], ids[p:], [-math.log(vocab)] * o, [1] * o, 1.0 if j % 2 == 0 else -1.0, 0, j,
                         True, "execution"))  # fmt: skip
    return out


def shape_mode(args) -> dict:
    import ray
    import torch

    from common.policy.base import GenerationRequest, SamplingParams
    from common.policy.models import load_tokenizer
    from common.train_config import TrainConfig
    from level2_distributed.colocate import ColocatedRank
    from level2_distributed.config import Level2Config
    from level2_distributed.placement import actor_env
    from level2_distributed.train import deal_microbatches, ray_init

    engine = args.engine or "auto"
    if engine == "auto":
        engine = "vllm" if gpu() else "hf"
    report: dict[str, Any] = {"mode": "shape", "shape": args.shape, "engine": engine, "dtype": args.dtype,
                              "gpu": gpu_name(), "phases": {}}  # fmt: skip
    if gpu():  # a run just before (another process) may still be releasing the GPU
        report["before"] = wait_for_gpu_release()
    with tempfile.TemporaryDirectory() as tmp:
        d = shape_dir(args.shape, Path(tmp) / f"shape-{args.shape}")
        n_params = count_params(d)
        weight_bytes = torch.finfo(getattr(torch, args.dtype)).bits // 8
        report.update(params=n_params, trainer_states_gib_expected=16 * n_params / 2**30,
                      engine_weights_gib_expected=n_params * weight_bytes / 2**30)  # fmt: skip
        cfg = TrainConfig.make(model=str(d), dtype=args.dtype, seed=0, lr=1e-6)
        ray_init(Level2Config())
        gpus = 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0
        cls = ray.remote(ColocatedRank).options(num_gpus=gpus, num_cpus=0, max_concurrency=64,
                                                runtime_env={"env_vars": actor_env()})  # fmt: skip
        fraction = args.checkpoint_fraction if args.fast_trainer else 1.0
        rank = cls.remote(0, 1, cfg, not args.no_activation_checkpointing, args.microbatch_tokens,
                          fast_trainer=args.fast_trainer, checkpoint_fraction=fraction)  # fmt: skip
        times: dict[str, float] = {}

        def phase(name: str, ref_or_fn):
            t = time.perf_counter()
            out = ref_or_fn() if callable(ref_or_fn) else ray.get(ref_or_fn)
            times[name] = time.perf_counter() - t
            report["phases"][name] = {**ray.get(rank.memory.remote())["now"], "seconds": times[name]}
            print(f"[shape] {name}: {times[name]:.1f} s, memory {report['phases'][name]}", flush=True)
            return out

        tok = load_tokenizer(str(d))
        probe = tok("The quick brown fox jumps over the lazy dog. " * 3)["input_ids"]

        def gap() -> float:
            eng = ray.get(rank.score_logprobs.remote(probe[:8], probe[8:]))
            want = ray.get(rank.trainer_logprobs.remote(probe[:8], probe[8:]))
            return max(abs(a - b) for a, b in zip(eng, want, strict=True))

        def generate() -> dict[str, float]:
            req = GenerationRequest(messages=[{"role": "user", "content": "Craft a wooden pickaxe."}],
                                    sampling=SamplingParams(args.shape_new_tokens, temperature=1.0, seed=0,
                                                            ignore_eos=True))  # fmt: skip
            t = time.perf_counter()
            outs = ray.get([rank.generate.remote(req) for _ in range(args.shape_requests)])
            n = sum(len(c.output_ids) for c, _ in outs)
            return {"requests": len(outs), "tokens": n, "tok_per_s": n / (time.perf_counter() - t),
                    "version": outs[0][1]}  # fmt: skip

        try:
            host, port = ray.get([rank.node_ip.remote(), rank.free_port.remote()])
            phase("trainer_built", rank.setup.remote(f"{host}:{port}"))
            phase(
                "engine_started",
                rank.setup_engine.remote(engine, args.dtype, args.batch, args.gpu_memory_utilization),
            )
            report["logprob_gap_before_sync"] = gap()
            report["generate_before"] = phase("engine_generated", generate)
            phase("engine_asleep", rank.sleep.remote())
            datums = synthetic_datums(
                args.shape_datums, args.shape_tokens, min(len(tok), shapes()[args.shape]["vocab_size"])
            )
            lengths = [len(x.prompt_ids) + len(x.output_ids) for x in datums]
            (mbs,) = deal_microbatches(lengths, args.microbatch_tokens, 1)
            n_tokens = float(sum(x.num_trained_tokens for x in datums))
            m = phase("train_step", rank.train_step.remote([([datums[i] for i in mb], [1.0] * len(mb)) for mb in mbs],
                                                           n_tokens, round=0))  # fmt: skip
            report["step"] = {k: v for k, v in m.items() if isinstance(v, (int, float))}
            phase("engine_woken", rank.wake.remote())
            phase("engine_synced", rank.sync_engine.remote(1))
            report["logprob_gap_after_sync"] = gap()
            report["generate_after"] = phase("engine_generated_after_sync", generate)
            mem = ray.get(rank.memory.remote())
            report["phase_peaks"] = {k: v["phase_peak"] for k, v in mem["phases"].items()}
            report["peak_gib"] = mem["peak"]
            report["engine_calls"] = ray.get(rank.engine_calls.remote())
        finally:
            ray.kill(rank)
    key = "gpu_used" if gpu() else "rss"
    total = report["phases"].get("trainer_built", {}).get("gpu_total")
    report["memory_kind"] = "GPU in use, whole device (GiB)" if key == "gpu_used" else "process RSS (GiB)"
    report["fits"] = None if total is None else bool(report["peak_gib"] < total)
    print(
        f"\nshape {args.shape}: {n_params / 1e9:.2f}B params, engine {engine}, {args.dtype}; {report['memory_kind']}"
    )
    print("| phase | in use | phase peak | torch allocated | seconds |")
    print("|---|---|---|---|---|")
    for name, ph in report["phases"].items():
        print(f"| {name} | {ph.get(key, float('nan')):.2f} | {report['phase_peaks'].get(name, float('nan')):.2f} | "
              f"{ph.get('torch_allocated', float('nan')):.2f} | {ph['seconds']:.1f} |")  # fmt: skip
    print(f"peak {report['peak_gib']:.2f} GiB" + (f" of {total:.1f} (fits: {report['fits']})" if total else "")
          + f"; step loss {report['step'].get('loss/cispo', float('nan')):.4g}, grad norm "
          f"{report['step'].get('grad_norm', float('nan')):.3g}; engine vs trainer log-prob gap "
          f"{report['logprob_gap_before_sync']:.3g} before the sync, "
          f"{report['logprob_gap_after_sync']:.3g} after")  # fmt: skip
    write(args.out, report)
    return report


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--rollouts", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--trainers", type=int, default=1)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--single-node", type=int, default=0)
    ap.add_argument("--weight-sync", default="broadcast")
    ap.add_argument("--trainer-gpus", type=float, default=-1.0, help="level 2: GPUs per trainer actor (-1 auto)")
    ap.add_argument("--server-gpus", type=float, default=-1.0,
                    help="level 2: GPUs per server (-1 auto; 0.5 with --trainer-gpus 0.5 --weight-sync disk: "
                         "split mode on one GPU)")  # fmt: skip
    ap.add_argument("--server-gpu-memory-utilization", type=float, default=0.85, help="level 2's vLLM servers")
    ap.add_argument(
        "--server-engine",
        default="auto",
        help="level 2 only: auto (vllm on GPUs, hf on CPU), hf, vllm, sglang",
    )
    ap.add_argument("--engine", default=None, choices=["auto", "hf", "vllm"],
                    help="both tiers' engine (level 2's colocated engines or servers, level 1's rollout engine); "
                         "default: --server-engine for level 2 and hf for level 1")  # fmt: skip
    ap.add_argument(
        "--server-python", default="", help="interpreter of the engine processes (e.g. a vLLM venv)"
    )
    ap.add_argument("--colocate", action="store_true", help="a trainer rank and its engine per GPU")
    ap.add_argument("--sync-check", action="store_true", help="report sync/logprob_gap after every sync")
    ap.add_argument("--level1", action="store_true", help="also run level 1 (one process) on the same config")
    ap.add_argument("--batch", type=int, default=64, help="requests per engine batch (both tiers)")
    ap.add_argument(
        "--microbatch-tokens", type=int, default=4096, help="tokens per packed training row (both)"
    )
    ap.add_argument("--fast-trainer", action="store_true", help="level 1's fast trainer on both tiers")
    ap.add_argument("--checkpoint-fraction", type=float, default=1.0, help="with --fast-trainer (both tiers)")
    ap.add_argument("--compile-layers", action="store_true",
                    help="with --fast-trainer: torch.compile the decoder layers on both tiers (default: neither)")  # fmt: skip
    ap.add_argument("--no-activation-checkpointing", action="store_true",
                    help="level 2 without --fast-trainer: no recompute (level 1's plain trainer has none)")  # fmt: skip
    ap.add_argument(
        "--engine-process", action="store_true", help="level 1: vLLM's engine core in its own process"
    )
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="level 1 and shape mode's vLLM")
    ap.add_argument("--shape", default="", help="shape mode: qwen3-4b or tiny (see the module docstring)")
    ap.add_argument("--shape-datums", type=int, default=8)
    ap.add_argument("--shape-tokens", type=int, default=2048, help="tokens per synthetic datum")
    ap.add_argument(
        "--shape-requests", type=int, default=16, help="concurrent generations per generate phase"
    )
    ap.add_argument("--shape-new-tokens", type=int, default=64)
    ap.add_argument("--out", default="", help="write the results as JSON here")
    return ap


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    if args.shape and args.shape not in shapes():
        raise SystemExit(f"--shape {args.shape!r}: choose one of {', '.join(shapes())}")
    return shape_mode(args) if args.shape else loop_mode(args)


if __name__ == "__main__":
    main()
