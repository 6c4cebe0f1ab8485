"""Level-1 rounds measured alone and side by side on one GPU (issue #49): 1, 2 and 4 runs at once.

Each SET is a list of runs started together (``rao``, ``sera``), each a real ``sera train --level 1``
process with its own vLLM engine, given ``--gpu-share RUN_GIB / CARD`` (bench/gpu_fit.py; its trainer sizes
itself to that share). A set ends when every run has logged ROUNDS rounds; its runs are then stopped (SIGTERM:
checkpoint and exit) and the next set starts. Then one table: per run, the median round (rollout / train)
seconds over rounds 1.. (round 0 pays torch.compile), generated tokens/s, train tokens/s, and the run's
peak on the card (``mem/gpu_run_gib``: trainer process + its engine process); and the ratios: SERA alone /
RAO alone, and each shared set's rounds / the same method alone.

    python bench/bench_gpu_share.py run OUT                       # the default sets, one GPU (vLLM)
    python bench/bench_gpu_share.py run OUT --sets "rao|sera|rao,sera|sera,rao,sera,rao" --rounds "6|6|4|10"
    python bench/bench_gpu_share.py run OUT --sets "rao|rao-s1" --rounds "12|12"   # --max-staleness 0 vs 1 (#53)
    python bench/bench_gpu_share.py table OUT                     # the table of whatever ran (also at the end)
    MODEL=tiny ENGINE=hf GPU_TOTAL_GIB=80 python bench/bench_gpu_share.py run /tmp/gs --sets "rao|rao,sera" --run-gib 8 \
        --rounds "2|2" --extra "--max-steps 2 --max-new-tokens 12 --rubric-max-new-tokens 16 \
        --score-max-new-tokens 16 --tasks-per-step 1 --rollouts-per-task 2 --codeact-executor worker-ordered \
        --oracle-mix 0.7 --score-noise 0.3"                       # the CPU dry run of the same flow (~3 min)

A run may carry options: ``sera-kv12`` (its engine's KV cache 12 GiB, the trainer's part unchanged), ``rao-s1``
(``--max-staleness 1``), ``rao-s1-ip`` (and the engine core in the trainer's process). The table adds, per run,
the slowest tree, the rubric/score tail, tokens by call role and the trainer's wait for rollouts
(``time/rollout_wait_s``, overlapped runs), and per set the GPU's busy share (``nvidia-smi`` utilization sampled
every second once every run is past round 0: OUT/<set>/gpu_util.tsv); and, for an ``-sN`` run alone, its round
over the rollout of the same method's N=0 run alone (issue #53's measure: <= 1.10x when training is hidden).

``--profile-at-round N``: once every run of a set has logged N rounds, py-spy records each for ``--profile-s``
seconds (which thread held the GIL: ``<run>/pyspy_gil_r<N>.txt`` and its summary ``.md``, bench/gil_profile.py).

Resumable within a time budget (a preemptible or time-limited GPU job): a finished set leaves OUT/<set>/done
and is skipped; a set cut by ``--budget-s`` or a kill goes on from its runs' checkpoints (``--resume``;
rounds already logged count). Every run's files: OUT/<set>/<i>_<method>/ (metrics.jsonl, config.json, log).
Simplifications: the runs train on the first 64 easy TextCraft train tasks, LoRA rank 4, lr 1e-4, 8 tasks x 8
rollouts (the learning drivers' setting), no held-out evaluation.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_fit import card_total_gib, fit, run_budget_gib  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SETS = "rao|sera|rao,sera|sera,rao,sera,rao"
DEFAULT_ROUNDS = "6|6|4|10"
TOKENS = ("gen/act_tokens", "gen/rubric_tokens", "gen/score_tokens")


def rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            continue
    return out


def parse_run(spec: str) -> tuple[str, float | None, int, bool]:
    """A run of a set: ``rao`` / ``sera``, optionally ``-kvN`` (its engine's KV cache N GiB instead of KV_GIB;
    its share of the card grows by the difference, so the trainer keeps its part), ``-sN``
    (``--max-staleness N``: rollouts of the next round in flight during training, issue #53) and ``-ip``
    (``--no-engine-process``: vLLM's engine core in the trainer's process: one CUDA context and one GIL;
    bench/bench_stream_share.py found decode-like steps slower beside a training load that way than with the
    load in another process, 2.19x vs 1.45x).

    >>> parse_run("sera"), parse_run("rao-kv12"), parse_run("rao-s1"), parse_run("sera-s1-kv8")
    (('sera', None, 0, False), ('rao', 12.0, 0, False), ('rao', None, 1, False), ('sera', 8.0, 1, False))
    >>> parse_run("rao-s1-ip")
    ('rao', None, 1, True)
    """
    method, *opts = spec.split("-")
    kv, staleness, in_process = None, 0, False
    for o in opts:
        if o.startswith("kv") and o[2:].replace(".", "", 1).isdigit():
            kv = float(o[2:])
        elif o.startswith("s") and o[1:].isdigit():
            staleness = int(o[1:])
        elif o == "ip":
            in_process = True
        else:
            method = ""
    if method not in ("rao", "sera"):
        raise ValueError(
            f"a run is rao or sera, optionally -kvN (GiB), -sN (max staleness) and -ip (engine in-process): {spec!r}"
        )
    return method, kv, staleness, in_process


def command(
    py: str, out: Path, spec: str, seed: int, share: float | None, tasks: Path, extra: str, total: float = 0.0
) -> list[str]:
    method, kv_run, staleness, in_process = parse_run(spec)
    model, engine = os.environ.get("MODEL", "smollm2"), os.environ.get("ENGINE", "vllm")
    init = "none" if model == "tiny" else "auto"
    cmd = [py, "-m", "sera", "train", "--level", "1", "--model", model, "--init-adapter", init,
           "--method", method, "--engine", engine, "--tasks", str(tasks), "--tasks-per-step", "8",
           "--rollouts-per-task", "8", "--max-steps", "3", "--max-depth", "3", "--max-new-tokens", "256",
           "--max-prompt-tokens", "2048", "--rubric-max-new-tokens", "320", "--score-max-new-tokens", "256",
           "--counterfactual-k", "4", "--lora-rank", "4", "--lr", "1e-4", "--max-batch-size", "256",
           "--seed", str(seed), "--steps", "1000", "--max-idle-rounds", "50", "--save-every", "5",
           "--out", str(out), "--resume"]  # fmt: skip
    if method == "sera":
        cmd += ["--schedule", "execution:16,delegation:2,rubric:2"]
    if staleness:
        cmd += ["--max-staleness", str(staleness)]
    if in_process:
        cmd += ["--no-engine-process"]
    if share is not None and engine == "vllm":
        kv = float(os.environ.get("KV_GIB", "4"))
        if kv_run is not None and total > 0:  # more KV cache, the same trainer part
            share, kv = round(share + (kv_run - kv) / total, 4), kv_run
        cmd += ["--gpu-share", f"{share}", "--kv-cache-gib", f"{kv:g}"]
    return cmd + extra.split()


def run_set(args, name: str, methods: list[str], rounds: int, t_end: float, share: float | None) -> bool:
    """Start the set's runs together, wait until each logged ``rounds`` rounds (or the budget ends), stop
    them. True when the set is complete."""
    d = args.out / name
    if (d / "done").exists():
        return True
    d.mkdir(parents=True, exist_ok=True)
    procs: dict[str, subprocess.Popen] = {}
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for i, m in enumerate(methods):
        run = d / f"{i}_{m}"
        run.mkdir(exist_ok=True)
        if len(rows(run / "metrics.jsonl")) >= rounds:
            continue
        cache = args.out / "vllm_cache" / f"{name}_{i}"
        if not cache.exists() and (args.out / "vllm_cache" / "seed").exists():  # a warm compile cache
            subprocess.run(["cp", "-r", str(args.out / "vllm_cache" / "seed"), str(cache)], check=False)
        cmd = command(args.python, run, m, i, share, args.tasks, args.extra, args.total)
        log = open(run / "log.txt", "a")
        procs[m + str(i)] = subprocess.Popen(
            cmd, cwd=ROOT, env={**env, "VLLM_CACHE_ROOT": str(cache)}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        print(f"[{name}] started {run.name}: share {share}", flush=True)
    runs = [d / f"{i}_{m}" for i, m in enumerate(methods)]
    profiles: list[tuple[subprocess.Popen, Path, float]] = []
    profiled = not (args.profile_at_round and args.py_spy)
    while True:
        counts = [len(rows(r / "metrics.jsonl")) for r in runs]
        dead = [k for k, p in procs.items() if p.poll() is not None]
        if all(c >= rounds for c in counts) or time.time() > t_end or dead:
            break
        if not profiled and all(c >= args.profile_at_round for c in counts):  # each run mid-round, once
            profiled = True
            for i, m in enumerate(methods):
                p = procs.get(m + str(i))
                if p is not None and p.poll() is None:
                    sp = start_profile(args.py_spy, p.pid, runs[i], counts[i], args.profile_s)
                    if sp is not None:
                        profiles.append((sp, runs[i] / f"pyspy_gil_r{counts[i]}.txt", time.time()))
        if all(c >= 1 for c in counts):  # past start-up and round 0: how busy the GPU is (issue #53)
            util = gpu_utilization()
            if util is not None:
                with open(d / "gpu_util.tsv", "a") as f:
                    f.write(f"{time.time():.1f}\t{util:g}\n")
        time.sleep(1)
    finish_profiles(profiles, args.profile_s)  # before the runs stop (a record still going is cut short)
    for p in procs.values():  # SIGTERM: the run checkpoints and exits; then a kill
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs.values():
        try:
            p.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    counts = [len(rows(r / "metrics.jsonl")) for r in runs]
    print(
        f"[{name}] rounds {counts} (want {rounds})" + (f"; exited early: {dead}" if dead else ""), flush=True
    )
    seed = args.out / "vllm_cache" / "seed"  # the first run's compile cache warms the later sets' starts
    if not seed.exists() and (args.out / "vllm_cache" / f"{name}_0").exists():
        subprocess.run(["cp", "-r", str(args.out / "vllm_cache" / f"{name}_0"), str(seed)], check=False)
    if all(c >= rounds for c in counts):
        (d / "done").touch()
        return True
    return False


def start_profile(spy: str, pid: int, run: Path, rnd: int, seconds: float) -> subprocess.Popen | None:
    """py-spy on a live run for ``seconds``: which thread holds the GIL, sampled 100 times a second without
    pausing the run (``--nonblocking``), into ``run/pyspy_gil_r<rnd>.txt`` (its own log ``pyspy.log``).
    None when py-spy cannot start."""
    out = run / f"pyspy_gil_r{rnd}.txt"
    cmd = [spy, "record", "--pid", str(pid), "--duration", f"{seconds:g}", "--rate", "100", "--threads",
           "--gil", "--nonblocking", "--format", "raw", "-o", str(out)]  # fmt: skip
    try:
        return subprocess.Popen(cmd, stdout=open(run / "pyspy.log", "a"), stderr=subprocess.STDOUT)
    except OSError as e:
        print(f"[profile] py-spy did not start ({e}): no profile of {run.name}", flush=True)
        return None


def finish_profiles(profiles: list[tuple[subprocess.Popen, Path, float]], seconds: float) -> None:
    """End the py-spy records (one still running when the set is done is interrupted: py-spy then writes what
    it sampled) and write each one's summary beside it (``bench/gil_profile.py``: every thread's share of the
    GIL over the seconds it recorded, and its top frames), or say why there is none."""
    from gil_profile import summarize

    for proc, raw, t0 in profiles:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        md = raw.with_suffix(".md")
        if raw.exists():
            took = min(seconds, time.time() - t0)
            md.write_text(summarize(raw.read_text(errors="replace"), took, 100.0) + f"\n\n{took:.1f} s recorded\n")
        else:
            md.write_text(f"no profile: py-spy exited {proc.returncode} (see pyspy.log; it needs ptrace rights)\n")
        print(f"[profile] {md}", flush=True)


def gpu_utilization() -> float | None:
    """The GPU's busy percentage now (``nvidia-smi``'s utilization.gpu: the share of the last sample period in
    which a kernel ran; the first GPU), or None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout.split()  # fmt: skip
        return float(out[0]) if out else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def median(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def table(out: Path) -> str:
    lines = [
        "| set | run | rounds | round s | rollout s | train s | gen tok/s | train tok/s | peak GiB (run) | trainer plan "
        "| slowest tree s | rubric/score tail s (mean, max) | act / rubric / score tokens | trainer wait s | GPU busy % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    alone: dict[str, float] = {}
    alone_rollout: dict[str, float] = {}
    shared: list[tuple[str, str, float]] = []
    for d in sorted(p for p in out.iterdir() if p.is_dir() and p.name.startswith("set")):
        util = (
            [float(x.split("\t")[1]) for x in (d / "gpu_util.tsv").read_text().split("\n") if "\t" in x]
            if (d / "gpu_util.tsv").exists()
            else []
        )
        busy = statistics.mean(util) if util else float("nan")
        for run in sorted(p for p in d.iterdir() if p.is_dir()):
            rs = [r for r in rows(run / "metrics.jsonl") if "time/round_s" in r]
            later = rs[1:] or rs
            cfg = json.loads((run / "config.json").read_text()) if (run / "config.json").exists() else {}
            plan = cfg.get("memory_plan") or {}
            peak = max((r.get("mem/gpu_run_gib", float("nan")) for r in rs), default=float("nan"))
            rnd = median([r["time/round_s"] for r in later])
            method = run.name.split("_", 1)[1]
            n = len([p for p in d.iterdir() if p.is_dir()])
            tokens = [median([r.get(k, float("nan")) for r in later]) for k in TOKENS]
            roll = median([r["time/rollout_s"] for r in later])
            if n == 1:
                alone[method], alone_rollout[method] = rnd, roll
            else:
                shared.append((d.name, method, rnd))
            lines.append(
                f"| {d.name} | {run.name} | {len(rs)} | {rnd:.1f} | {roll:.1f} "
                f"| {median([r['time/train_s'] for r in later]):.1f} | {median([r.get('tokens_per_s', float('nan')) for r in later]):.0f} "
                f"| {median([r.get('train/tokens_per_s', float('nan')) for r in later]):.0f} | {peak:.1f} "
                f"| {plan.get('tokens', '-')} tok, ckpt {plan.get('checkpoint_fraction', '-')} "
                f"| {median([r.get('time/tree_max_s', float('nan')) for r in later]):.1f} "
                f"| {median([r.get('time/tail_mean_s', float('nan')) for r in later]):.1f}, "
                f"{median([r.get('time/tail_max_s', float('nan')) for r in later]):.1f} "
                f"| {' / '.join(f'{v:.0f}' for v in tokens)} "
                f"| {median([r.get('time/rollout_wait_s', float('nan')) for r in later]):.1f} | {busy:.0f} |"
            )
    for kv in sorted({m.partition("-")[2] for m in alone}):
        sera, rao = alone.get("sera" + (f"-{kv}" if kv else "")), alone.get("rao" + (f"-{kv}" if kv else ""))
        if sera and rao:
            lines.append(
                f"\nSERA round / RAO round, each alone on the card{f' ({kv})' if kv else ''}: {sera / rao:.2f}x"
            )
    if (out / "mps.txt").exists():  # gpu_share_call.sh MPS=1: the set's processes ran through a CUDA MPS daemon
        lines.append("\nCUDA MPS on: each run's trainer and engine core ran their kernels at once, not by turns")
    for m in sorted(alone):  # issue #53: training hidden behind rollouts when the N=1 round ~ the N=0 rollout
        base, _, staleness, _ = parse_run(m)
        if staleness and base in alone_rollout:
            lines.append(
                f"{m} round / {base} rollout, each alone on the card: {alone[m] / alone_rollout[base]:.2f}x "
                f"({alone[m]:.1f} s / {alone_rollout[base]:.1f} s; training hidden when <= 1.10x)"
            )
    for name, method, rnd in shared:
        if method in alone:
            lines.append(f"{name} {method}: round {rnd / alone[method]:.2f}x its alone round")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("run", "table"))
    ap.add_argument("out", type=Path)
    ap.add_argument("--sets", default=DEFAULT_SETS, help="sets separated by |, runs by , (rao or sera)")
    ap.add_argument("--rounds", default=DEFAULT_ROUNDS, help="rounds per set, separated by |")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop (resumably) after this many seconds")
    ap.add_argument("--run-gib", type=float, default=None, help="a run's budget (default: bench/gpu_fit.tsv)")
    ap.add_argument("--extra", default="", help="flags added to every run's sera train")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--profile-at-round", type=int, default=0,
                    help="once every run of a set has logged this many rounds, py-spy each for --profile-s (0: never)")
    ap.add_argument("--profile-s", type=float, default=20.0, help="seconds of each py-spy record")
    ap.add_argument("--py-spy", default=None, help="the py-spy program (default: gil_profile.find_py_spy)")
    args = ap.parse_args(argv)
    args.out = args.out.resolve()
    if args.profile_at_round:
        from gil_profile import find_py_spy

        args.py_spy = args.py_spy if args.py_spy and Path(args.py_spy).is_file() else find_py_spy()
        if args.py_spy is None:
            print("bench_gpu_share: no py-spy found ($SPY, PATH, /tmp/site/bin): no profiles", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.what == "table":
        print(table(args.out))
        return 0
    sets = [s.split(",") for s in args.sets.split("|")]
    rounds = [int(x) for x in args.rounds.split("|")]
    try:
        [parse_run(m) for s in sets for m in s]
    except ValueError as e:
        print(f"bench_gpu_share: {e}", file=sys.stderr)
        return 2
    if len(rounds) != len(sets):
        print("bench_gpu_share: --sets and --rounds must match", file=sys.stderr)
        return 2
    total = args.total = card_total_gib()
    run_gib = (
        args.run_gib
        if args.run_gib is not None
        else run_budget_gib(os.environ.get("MODEL", "smollm2"), "lora")
    )
    widest = max(len(s) for s in sets)
    try:  # every set starts its runs together: the widest must fit at once
        slots, share = fit(widest, run_gib, total) if total > 0 else (widest, None)
    except ValueError as e:
        print(f"bench_gpu_share: {e}", file=sys.stderr)
        return 2
    if slots < widest:
        print(f"bench_gpu_share: {widest} runs of {run_gib:g} GiB do not fit this {total:.1f} GiB card at once "
              f"({slots} do): nothing started", file=sys.stderr)  # fmt: skip
        return 2
    args.tasks = args.out / "tc_train_easy.jsonl"
    if not args.tasks.exists():
        subprocess.run([args.python, "-m", "sera", "data", "textcraft", "--split", "train", "--n", "64", "--seed", "0",
                        "--difficulty", "easy", "--out", str(args.tasks)], cwd=ROOT, check=True)  # fmt: skip
    t_end = time.time() + args.budget_s
    for k, (methods, n) in enumerate(zip(sets, rounds, strict=True)):
        if not run_set(args, f"set{k}_{len(methods)}runs", methods, n, t_end, share):
            print("bench_gpu_share: budget spent; run the same command again to go on", flush=True)
            break
    print(table(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
