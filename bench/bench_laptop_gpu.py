"""The small tier on a laptop GPU (issue #54): the README's quick start (`sera train`, its defaults) with the
process's CUDA memory capped like a laptop card's, as one command that prints what a user waits for and holds.

    python bench/bench_laptop_gpu.py                       # quick start, capped at 8 GiB -> bench/runs/laptop_gpu_<date>/
    python bench/bench_laptop_gpu.py --cap-gib 0 --profile # no cap; a stack profile of every thread (+ py-spy if found)
    python bench/bench_laptop_gpu.py --part probe          # host RSS and GPU memory after each step of the set-up
    python bench/bench_laptop_gpu.py --part decode         # decode modes (hf / slots / CUDA graphs): ms per step
    python bench/bench_laptop_gpu.py --part tutorials      # the wall time of tutorials 05, 06 and 09 here
    python bench/bench_laptop_gpu.py --out /tmp/qs -- --model tiny --max-new-tokens 12   # any sera train options

``quickstart`` (the default part) runs ``sera train`` (level 0, SmolLM2 + the shipped warm start, 2 optimizer
steps) in a child process whose CUDA allocator is capped at ``--cap-gib`` (``torch.cuda.set_per_process_memory_
fraction``; 0 = the whole card), the model converted beforehand (``sera setup``, not timed). It prints and writes
``OUT/summary.json`` with exactly: ``wall_s`` (launch to exit of ``sera train``), ``optimizer_steps``,
``gpu_peak_gib`` (the run's own peak: ``mem/gpu_peak_gib`` of its metrics, torch's peak reservation plus what
NVML/nvidia-smi says the process holds beyond it, and nvidia-smi's samples of the process; 0 on a CPU),
``host_peak_rss_gb`` (the peak resident set of ``sera train`` and its descendants: the ``ru_maxrss`` that
``wait4`` gives for it, what ``/usr/bin/time -v`` prints), ``tokens_per_s`` (generated tokens per second of rollout, over the run's rounds)
and ``gpu`` (the card's name, ``cpu`` without one); beside it the run's ``metrics.jsonl`` and ``config.json``,
``log.txt`` (the run's output, each line stamped with seconds since launch) and ``details.json`` (the wall to
the last step's metrics line, per-round times, the resident set over time split into anonymous and
file-backed pages, nvidia-smi's memory and utilisation samples). ``--profile`` adds ``stacks.txt``: every
thread's Python stack sampled 50 times a second inside the run (collapsed stacks, flamegraph.pl/speedscope
read them) and its top functions, and ``pyspy.json`` (speedscope) when ``py-spy`` is installed.

``probe`` runs the set-up of a level-0 run step by step in this process (CUDA context, model + merged warm
start, the engine and one batch of replies, the optimizer, one training step, a checkpoint) and prints the
resident set (anonymous / file-backed) and GPU memory after each, to find what holds the host's memory.
``decode`` times the hf engine's decode modes on the recorded quick-start prompt (``--model thin`` is a
30-layer model with no compute to speak of: the host's cost of a step; with it, ``no-forward`` is the slot step
with its forward replaced by a saved output: what is left on the host when a CUDA graph replays the forward). ``tutorials`` runs tutorials 05, 06
and 09 in full and records their wall times and device.

Simplifications: one run, one seed (a round's length follows the trees the policy grows, so runs vary); the
cap bounds torch's allocator, not the CUDA context (~0.5 GiB beside it); the resident set is sampled every
0.5 s for the timeline, its peak is the kernel's. Results: bench/RESULTS.md, "On a laptop GPU".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # gil_profile: the py-spy locator

from gil_profile import find_py_spy  # noqa: E402

GIB = float(2**30)
SUMMARY_KEYS = ("wall_s", "optimizer_steps", "gpu_peak_gib", "host_peak_rss_gb", "tokens_per_s", "gpu")
"""summary.json's keys, exactly (issue #54)."""
TUTORIALS = ("05_one_training_step", "06_level0_training", "09_learning_demo")

# The child: cap the allocator, optionally sample every thread's stack, then be `sera train ARGS`.
CHILD = r"""
import json, os, sys
cap = float(os.environ.get("SERA_BENCH_CAP_GIB") or 0)
if cap > 0:
    import torch
    if torch.cuda.is_available():
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap * 2**30 / total), 0)
stacks_path = os.environ.get("SERA_BENCH_STACKS")
if stacks_path:
    sys.path.insert(0, os.environ["SERA_BENCH_ROOT"])
    from bench.bench_laptop_gpu import StackSampler
    StackSampler(stacks_path).start()
sys.argv = ["sera", "train", *json.loads(os.environ["SERA_BENCH_ARGV"])]
from sera.cli import app
app()
"""


# ----------------------------------------------------------------------------------------------------------
# Measuring: /proc, nvidia-smi, a stack sampler.
# ----------------------------------------------------------------------------------------------------------
def proc_status(pid: int) -> dict[str, float]:
    """VmRSS, VmHWM, RssAnon, RssFile, RssShmem of ``pid`` in GB (10^9 bytes; {} once it is gone)."""
    out: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                    out[key] = int(rest.split()[0]) * 1e3 / 1e9
    except (OSError, ValueError, IndexError):
        return {}
    return out


def descendants(pid: int) -> set[int]:
    """Every descendant process of ``pid`` (Linux /proc)."""
    from common.run.trainer_memory import _children

    return _children(pid)


def nvidia_smi(query: str, fields: str) -> list[list[str]]:
    """Rows of ``nvidia-smi --query-QUERY=FIELDS`` (empty without nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        text = subprocess.run(
            ["nvidia-smi", f"--query-{query}={fields}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return [[x.strip() for x in line.split(",")] for line in text.splitlines() if line.strip()]


def gpu_name() -> str:
    """The first GPU's name (nvidia-smi; torch when nvidia-smi is missing), ``cpu`` without one. This process
    makes no CUDA context of its own for it."""
    rows = nvidia_smi("gpu", "name")
    if rows:
        return rows[0][0]
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - no torch, no CUDA: a CPU
        pass
    return "cpu"


class StackSampler(threading.Thread):
    """Every thread's Python stack, ``hz`` times a second, in this process; at exit ``path`` gets the collapsed
    stacks (``thread;outer;...;inner count``, the flamegraph format) and the functions on top of the most
    samples (self) and in the most samples (total). Where the host's time goes when py-spy is not there."""

    def __init__(self, path: str, hz: float = 50.0) -> None:
        super().__init__(daemon=True, name="stack-sampler")
        self.path, self.period = path, 1.0 / hz
        self.counts: dict[str, int] = {}
        self.samples = 0

    def run(self) -> None:
        import atexit

        atexit.register(self.write)
        me = threading.get_ident()
        while True:
            names = {t.ident: t.name for t in threading.enumerate()}
            for tid, frame in sys._current_frames().items():
                if tid == me:
                    continue
                stack = []
                while frame is not None:
                    code = frame.f_code
                    stack.append(f"{Path(code.co_filename).name}:{code.co_name}")
                    frame = frame.f_back
                key = ";".join([names.get(tid, str(tid)), *reversed(stack)])
                self.counts[key] = self.counts.get(key, 0) + 1
            self.samples += 1
            time.sleep(self.period)

    IDLE = ("threading.py:wait", "thread.py:_worker", "selectors.py:select", "queue.py:get", "threading.py:_wait_for_tstate_lock")
    """Frames a thread waits in (a sample whose top frame is one of these is idle, not work)."""

    def write(self) -> None:
        own: dict[str, int] = {}
        total: dict[str, int] = {}
        busy: dict[str, list[int]] = {}  # thread -> [busy samples, all samples]
        for key, n in self.counts.items():
            parts = key.split(";")
            idle = parts[-1] in self.IDLE
            b = busy.setdefault(parts[0], [0, 0])
            b[0], b[1] = b[0] + (0 if idle else n), b[1] + n
            if idle:
                continue
            own[parts[-1]] = own.get(parts[-1], 0) + n
            for fn in set(parts[1:]):
                total[fn] = total.get(fn, 0) + n
        lines = [f"# {self.samples} samples at {1 / self.period:.0f} Hz of every thread; busy share per thread "
                 f"(top frame not a wait: {', '.join(self.IDLE)}):"]  # fmt: skip
        lines += [f"#   {t}: {b[0] / max(1, self.samples):.2f} busy ({b[0]} of {self.samples} samples)"
                  for t, b in sorted(busy.items(), key=lambda x: -x[1][0])]  # fmt: skip
        lines += ["# top functions by busy samples on top of a stack (self):"]
        lines += [f"#   {n:7d}  {fn}" for fn, n in sorted(own.items(), key=lambda x: -x[1])[:40]]
        lines += ["# top functions by busy samples anywhere in a stack (total):"]
        lines += [f"#   {n:7d}  {fn}" for fn, n in sorted(total.items(), key=lambda x: -x[1])[:40]]
        lines += [f"{k} {n}" for k, n in sorted(self.counts.items(), key=lambda x: -x[1])[:5000]]
        Path(self.path).write_text("\n".join(lines) + "\n")



# ----------------------------------------------------------------------------------------------------------
# Part quickstart.
# ----------------------------------------------------------------------------------------------------------
def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written
    return rows


def summarize(rows: list[dict[str, Any]], wall_s: float, rss_gb: float, smi_peak_gib: float, gpu: str) -> dict:
    """summary.json from the run's metrics rows and what was measured outside it."""
    stepped = [r for r in rows if not r.get("train/skipped") and "grad_norm" in r]
    rollout_s = sum(float(r.get("time/rollout_s") or 0) for r in rows)
    tokens = sum(float(r.get("tokens_per_s") or 0) * float(r.get("time/rollout_s") or 0) for r in rows)
    torch_peak = max([float(r.get("mem/gpu_peak_gib") or 0) for r in rows] + [0.0])
    summary = {
        "wall_s": round(wall_s, 1),
        "optimizer_steps": len(stepped),
        "gpu_peak_gib": round(max(torch_peak, smi_peak_gib), 2),
        "host_peak_rss_gb": round(rss_gb, 2),
        "tokens_per_s": round(tokens / rollout_s, 1) if rollout_s > 0 else 0.0,
        "gpu": gpu,
    }
    assert tuple(summary) == SUMMARY_KEYS
    return summary


def quickstart(out: Path, cap_gib: float, train_args: list[str], profile: bool, keep_run: bool) -> int:
    out.mkdir(parents=True, exist_ok=True)
    gpu = gpu_name()
    run = Path(tempfile.mkdtemp(prefix="sera-bench-laptop-gpu-")) / "run"
    argv = ["--out", str(run), *train_args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "PYTHONUNBUFFERED": "1", "SERA_BENCH_ARGV": json.dumps(argv), "SERA_BENCH_CAP_GIB": str(cap_gib),
           "SERA_BENCH_ROOT": str(ROOT)}  # fmt: skip
    if profile:
        env["SERA_BENCH_STACKS"] = str(out / "stacks.txt")
    model = train_args[train_args.index("--model") + 1] if "--model" in train_args else "smollm2"
    t = time.perf_counter()  # the model converted once, beforehand: the quick start with its model cached
    subprocess.run([sys.executable, "-m", "sera", "setup", "--model", model], env=env, cwd=ROOT,
                   capture_output=True, text=True, check=True)  # fmt: skip
    setup_s = time.perf_counter() - t
    print(f"[bench] sera setup: {setup_s:.1f} s (not timed); gpu: {gpu}; cap: {cap_gib or 'none'} GiB", flush=True)
    want = int(train_args[train_args.index("--steps") + 1]) if "--steps" in train_args else 2

    t0 = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", CHILD], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, bufsize=1)  # fmt: skip
    spy = None
    if profile and (spy_bin := find_py_spy()):
        spy = subprocess.Popen([spy_bin, "record", "--pid", str(child.pid), "--rate", "50", "--threads",
                                "--nonblocking", "--format", "speedscope", "-o", str(out / "pyspy.json")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    timeline: list[list[float]] = []
    smi: list[list[float]] = []
    state = {"last_step_s": None, "main_peak": {}}
    done = threading.Event()

    def sample() -> None:  # host memory every 0.5 s, nvidia-smi every 1 s, the metrics' steps
        last_smi = 0.0
        while not done.is_set():
            now = time.perf_counter() - t0
            st = proc_status(child.pid)
            tree = sum(proc_status(p).get("VmRSS", 0.0) for p in descendants(child.pid))
            if st:
                timeline.append([round(now, 1), st.get("VmRSS", 0), st.get("RssAnon", 0), st.get("RssFile", 0),
                                 st.get("RssShmem", 0), round(st.get("VmRSS", 0) + tree, 3)])  # fmt: skip
                if st.get("VmRSS", 0) >= state["main_peak"].get("VmRSS", 0):
                    state["main_peak"] = {**st, "at_s": round(now, 1)}
            if now - last_smi >= 1.0 and gpu != "cpu":
                last_smi = now
                procs = {int(r[0]): float(r[1]) for r in nvidia_smi("compute-apps", "pid,used_memory")
                         if len(r) == 2 and r[0].isdigit() and r[1].replace(".", "").isdigit()}  # fmt: skip
                mine = sum(v for p, v in procs.items() if p == child.pid or p in descendants(child.pid))
                util = nvidia_smi("gpu", "utilization.gpu,memory.used")
                smi.append([round(now, 1), mine, float(util[0][0]) if util else -1, float(util[0][1]) if util else -1])
            if state["last_step_s"] is None:
                rows = read_metrics(run / "metrics.jsonl")
                if sum(1 for r in rows if not r.get("train/skipped") and "grad_norm" in r) >= want:
                    state["last_step_s"] = round(now, 1)
            done.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    log = []
    assert child.stdout is not None
    for line in child.stdout:
        stamped = f"[{time.perf_counter() - t0:7.1f} s] {line.rstrip()}"
        log.append(stamped)
        print(stamped, flush=True)
    _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage (its reaped descendants included)
    wall = time.perf_counter() - t0
    rc = child.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    sampler.join()
    if spy is not None:
        try:
            spy.wait(timeout=30)
        except subprocess.TimeoutExpired:
            spy.kill()
    rss_gb = usage.ru_maxrss * 1e3 / 1e9  # what /usr/bin/time -v prints for it (not `sera setup`'s, run before)
    rows = read_metrics(run / "metrics.jsonl")
    smi_peak = max([s[1] for s in smi] + [0.0]) / 1024
    summary = summarize(rows, wall, rss_gb, smi_peak, gpu)
    for name in ("metrics.jsonl", "config.json"):
        if (run / name).exists():
            shutil.copy(run / name, out / name)
    (out / "log.txt").write_text("\n".join(log) + "\n")
    step = max(1, len(timeline) // 1500)
    details = {
        "command": f"sera train {' '.join(argv[2:])}".strip(),
        "cap_gib": cap_gib,
        "exit_code": rc,
        "setup_s": round(setup_s, 1),
        "wall_to_last_step_s": state["last_step_s"],
        "decode": {k: rows[-1].get(k) for k in rows[-1] if k.startswith("engine/")} if rows else {},
        "decode_warnings": [line for line in log if "[decode]" in line],
        "rounds": [{k: r.get(k) for k in ("round", "step", "stage", "time/rollout_s", "time/train_s",
                                          "time/round_s", "tokens_per_s", "mem/peak_rss_gb", "mem/gpu_peak_gib")}
                   for r in rows],  # fmt: skip
        "host_main_at_peak_gb": state["main_peak"],
        "host_tree_peak_gb": max([x[5] for x in timeline] + [0.0]),
        "rss_timeline": {"columns": ["s", "rss_gb", "anon_gb", "file_gb", "shmem_gb", "tree_rss_gb"],
                         "rows": timeline[::step]},  # fmt: skip
        "nvidia_smi": {"columns": ["s", "process_mib", "gpu_util_pct", "gpu_used_mib"], "rows": smi},
        "gpu_util_pct_mean": round(sum(s[2] for s in smi) / len(smi), 1) if smi else None,
    }
    (out / "details.json").write_text(json.dumps(details, indent=1) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if not keep_run:
        shutil.rmtree(run.parent, ignore_errors=True)
    print(
        f"[bench] {summary['optimizer_steps']} optimizer steps, wall {summary['wall_s']:.0f} s (last step's metrics "
        f"at {state['last_step_s']} s), {summary['tokens_per_s']:.0f} generated tok/s, GPU peak "
        f"{summary['gpu_peak_gib']:.2f} GiB, host peak RSS {summary['host_peak_rss_gb']:.2f} GB, on {gpu}; exit {rc}"
    )
    print(f"[bench] wrote {out}/summary.json (+ metrics.jsonl, config.json, log.txt, details.json)")
    return rc


# ----------------------------------------------------------------------------------------------------------
# Part probe: the set-up of a level-0 run, step by step.
# ----------------------------------------------------------------------------------------------------------
def probe(out: Path, model_name: str) -> None:
    import torch

    from common.memory import release_memory
    from common.policy.base import GenerationRequest, SamplingParams
    from common.policy.hf import HFPolicy, release_engine_cache
    from common.policy.models import load_model
    from common.policy.warmstart import resolve_init
    from common.run.checkpoint import RunState, TorchCheckpointer
    from common.run.optim import make_optimizer, place_optimizer_state
    from common.train_config import TrainConfig
    from level0_single_process.train import datum_logprobs, lean_training

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()

    def report(tag: str) -> None:
        st = proc_status(os.getpid())
        row = {"stage": tag, "s": round(time.perf_counter() - t0, 1), **{k: round(v, 3) for k, v in st.items()}}
        if device == "cuda":
            row |= {"gpu_alloc_gib": round(torch.cuda.memory_allocated() / GIB, 3),
                    "gpu_reserved_gib": round(torch.cuda.memory_reserved() / GIB, 3),
                    "gpu_max_reserved_gib": round(torch.cuda.max_memory_reserved() / GIB, 3)}  # fmt: skip
        rows.append(row)
        gpu = f"  GPU {row.get('gpu_reserved_gib', 0):5.2f} GiB" if device == "cuda" else ""
        print(f"{row['s']:6.1f} s  {tag:46s} RSS {st.get('VmRSS', 0):5.2f} GB (anon {st.get('RssAnon', 0):5.2f}, "
              f"file {st.get('RssFile', 0):5.2f}) peak {st.get('VmHWM', 0):5.2f} GB{gpu}", flush=True)  # fmt: skip

    report("torch imported")
    if device == "cuda":
        torch.zeros(1, device=device)
        report("CUDA context")
    cfg = TrainConfig.make(model=model_name)
    init = resolve_init(cfg.init_adapter, cfg.model, cfg.env, cfg.seed)
    model, tok = load_model(cfg.model, dtype=cfg.optim.dtype, device=device, seed=cfg.seed, adapter=init.adapter)
    report(f"model loaded ({cfg.optim.dtype}, warm start {'merged' if init.adapter else 'none'})")
    policy = HFPolicy(model, tok, max_batch_size=cfg.max_batch_size, seed=cfg.seed)
    calls = json.loads((ROOT / "tests/fixtures/warmstart_calls.json").read_text())
    reqs = [GenerationRequest(calls["act_messages"], SamplingParams(128, temperature=1.0, seed=i, ignore_eos=True))
            for i in range(4)]  # fmt: skip
    policy.generate_batch(reqs)
    report(f"engine ({policy.decode}): 4 replies x 128 tokens")
    opt = make_optimizer(model, cfg.optim)
    lean_training(model, opt)
    work = Path(tempfile.mkdtemp(prefix="sera-bench-probe-"))
    place_optimizer_state(opt, cfg.optim.optimizer_state, work / "optimizer_state", device)
    report("optimizer (fp32 masters; AdamW moments at the first step)")
    release_engine_cache(policy)
    release_memory()
    report("engine's cache released")
    text = tok.apply_chat_template(calls["act_messages"], tokenize=False, add_generation_prompt=True)

    class Datum:
        prompt_ids = tok(text, add_special_tokens=False)["input_ids"]
        output_ids = tok(calls["act_text"], add_special_tokens=False)["input_ids"]

    model.train()
    (-datum_logprobs(model, Datum).sum()).backward()
    opt.clip_and_step(1.0)
    model.eval()
    report(f"one training step ({len(Datum.prompt_ids) + len(Datum.output_ids)} tokens)")
    release_memory()
    report("release_memory")
    TorchCheckpointer(work).save(RunState(step=1), model, opt, {"model": model_name})
    report("checkpoint written and read back")
    opt.close()
    shutil.rmtree(work, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1e3 / 1e9
    (out / "probe.json").write_text(json.dumps({"device": device, "gpu": gpu_name(), "peak_rss_gb": peak,
                                                "stages": rows}, indent=1) + "\n")  # fmt: skip
    print(f"[bench] peak RSS {peak:.2f} GB; wrote {out}/probe.json")


# ----------------------------------------------------------------------------------------------------------
# Part decode: the engine's decode modes.
# ----------------------------------------------------------------------------------------------------------
def run(policy: Any, messages: list[dict], batch: int, n: int) -> float:
    """Seconds for ``batch`` sampled replies of ``n`` tokens each to ``messages`` (EOS ignored), in one batch."""
    import torch

    from common.policy.base import GenerationRequest, SamplingParams

    reqs = [GenerationRequest(messages, SamplingParams(n, temperature=1.0, seed=i, ignore_eos=True))
            for i in range(batch)]  # fmt: skip
    cuda = policy.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    policy.generate_batch(reqs)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t


def decode(out: Path, model_name: str, batches: list[int], new_tokens: int) -> None:
    import torch

    from common.policy.hf import HFPolicy
    from common.policy.models import build_tiny_model, load_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if model_name == "thin":  # 30 layers of width 64: a step is nearly all host work (Python, launches)
        model, tok = build_tiny_model(0, num_layers=30, hidden_size=64, num_heads=4)
        model = model.to(device)
    else:
        dtype = "float32" if model_name in ("tiny", "tiny-tied") else "bfloat16"
        model, tok = load_model(model_name, dtype=dtype, device=device)
    messages = json.loads((ROOT / "tests/fixtures/warmstart_calls.json").read_text())["act_messages"]
    modes = ["hf", "slots"] + (["graphs"] if device == "cuda" else [])
    if model_name == "thin":  # what a graph leaves on the host: the slot step with its forward replaced by a
        modes.append("no-forward")  # saved output (the loop, sampling and bookkeeping; the tokens are junk)
    results = []
    for mode in modes:
        policy = HFPolicy(model, tok, max_batch_size=max(batches), decode="slots" if mode == "no-forward" else mode)
        if mode == "no-forward":
            forward, saved = policy._slots._forward, {}
            policy._slots._forward = lambda b, f=forward, s=saved: s[b] if b in s else s.setdefault(b, f(b))
        for b in batches:
            run(policy, messages, b, new_tokens)  # warm-up (a graph's capture happens here)
            prefill = min(run(policy, messages, b, 1) for _ in range(3))  # the least disturbed of a few runs
            full = min(run(policy, messages, b, new_tokens) for _ in range(2))
            step_s = max(1e-9, full - prefill) / max(1, new_tokens - 1)
            row = {"mode": mode, "batch": b, "ms_per_step": round(1e3 * step_s, 3),
                   "tokens_per_s": round(b / step_s, 1), "prefill_s": round(prefill, 3)}  # fmt: skip
            results.append(row)
            print(f"{mode:7s} batch {b:3d}: {row['ms_per_step']:8.2f} ms per decode step, {row['tokens_per_s']:9.1f} "
                  f"tok/s (prefill {prefill:.3f} s)", flush=True)  # fmt: skip
        policy.release_cache()
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode.json").write_text(json.dumps({"model": model_name, "device": device, "gpu": gpu_name(),
                                                 "new_tokens": new_tokens, "rows": results}, indent=1) + "\n")  # fmt: skip


# ----------------------------------------------------------------------------------------------------------
# Part tutorials.
# ----------------------------------------------------------------------------------------------------------
def tutorials(out: Path) -> None:
    rows = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "MPLBACKEND": "Agg"}  # fmt: skip
    for name in TUTORIALS:
        t = time.perf_counter()
        r = subprocess.run([sys.executable, str(ROOT / "tutorials" / f"{name}.py")], cwd=ROOT, env=env,
                           capture_output=True, text=True)  # fmt: skip
        wall = time.perf_counter() - t
        device = "cuda" if re.search(r"\bon cuda\b", r.stdout) else "cpu"
        key = next((line for line in r.stdout.splitlines() if line.startswith("TUTORIAL")), "")
        rows.append({"tutorial": name, "wall_s": round(wall, 1), "device": device, "exit_code": r.returncode,
                     "key_line": key})  # fmt: skip
        print(f"{name:24s} {wall:7.1f} s on {device} (exit {r.returncode}) {key}", flush=True)
        if r.returncode:
            print(r.stderr[-2000:], flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tutorials.json").write_text(json.dumps({"gpu": gpu_name(), "rows": rows}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    train_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, train_args = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="quickstart", choices=["quickstart", "probe", "decode", "tutorials"])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "runs" / f"laptop_gpu_{date.today().isoformat()}")
    ap.add_argument("--cap-gib", type=float, default=8.0, help="CUDA allocator cap of the run (0: the whole card)")
    ap.add_argument("--profile", action="store_true", help="quickstart: stack samples (+ py-spy) of the run")
    ap.add_argument("--keep-run", action="store_true", help="quickstart: keep the run directory (checkpoints)")
    ap.add_argument("--model", default="smollm2", help="probe / decode: the model (decode: 'thin' = 30 thin layers)")
    ap.add_argument("--batches", default="1,4,8", help="decode: batch sizes")
    ap.add_argument("--new-tokens", type=int, default=64, help="decode: tokens per reply")
    args = ap.parse_args(argv)
    if args.part == "quickstart":
        return quickstart(args.out, args.cap_gib, train_args, args.profile, args.keep_run)
    if args.part == "probe":
        probe(args.out, args.model)
    elif args.part == "decode":
        decode(args.out, args.model, [int(b) for b in args.batches.split(",")], args.new_tokens)
    else:
        tutorials(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
