"""How much a training load slows decode-like GPU steps beside it, by where the load runs (issue #53).

With ``--max-staleness 1`` the optimizer step runs while the engine decodes the next round. This bench
isolates the GPU side of that: a DECODE loop (SmolLM2-135M-shaped: 30 layers of small matmuls at batch 64,
then a synchronize, as an engine waits for each step's tokens) is timed alone and beside a TRAIN load (matmuls
of a 32K-token micro-batch, a synchronize every few, as the trainer reads its loss) placed

* ``same-stream``: in the same process, another thread, the same (default) stream: the decode step's
  kernels queue behind the load's;
* ``side-stream``: the same, the load on a stream of its own: one CUDA context, kernels of both may run at
  once;
* ``process``: in another process (vLLM's engine core in its own process, the CUDA default): two contexts,
  which the GPU time-slices.

It prints ms per decode step and its ratio to alone, and the load's matmuls per second beside it. Under CUDA
MPS (a daemon through which several processes' kernels run at once instead of by turns; start it before
this command) the ``process`` arrangement measures that instead, and ``--load-sm-percent`` caps the load's
share of the SMs.

    python bench/bench_stream_share.py [--seconds 6]
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log; nvidia-cuda-mps-control -d
    python bench/bench_stream_share.py --load-sm-percent 50; echo quit | nvidia-cuda-mps-control

Simplifications: matmuls only (no attention, no sampling), bf16, one GPU; the GIL is shared in the two
in-process arrangements as in a level-1 process (the load thread holds it while it launches). Needs only torch.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import threading
import time


def _decode_steps(seconds: float) -> float:
    """Median ms of a decode-like step over ``seconds``."""
    import torch

    x = torch.randn(64, 576, device="cuda", dtype=torch.bfloat16)
    w1 = torch.randn(576, 1536, device="cuda", dtype=torch.bfloat16) / 24
    w2 = torch.randn(1536, 576, device="cuda", dtype=torch.bfloat16) / 40
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        h = x
        for _ in range(30):
            h = h + (h @ w1).relu() @ w2
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times[3:] or times)


def _train_load(stop: threading.Event | None, seconds: float, side: bool, count: list[int]) -> None:
    import torch

    a = torch.randn(32768, 576, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(576, 1536, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    stream = torch.cuda.Stream() if side else torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        while (stop is None or not stop.is_set()) and time.perf_counter() < end:
            for _ in range(8):
                (a @ w).sum()
            torch.cuda.current_stream().synchronize()  # the loss read: releases the GIL while it waits
            count[0] += 8


def _load_process(seconds: float, started, sm_percent: int = 0) -> None:
    if sm_percent:  # under MPS: the share of the SMs this process may use (read when its CUDA context starts)
        os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(sm_percent)
    import torch

    torch.zeros(1, device="cuda")
    started.set()
    _train_load(None, seconds, False, [0])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=6.0, help="seconds per arrangement")
    ap.add_argument("--load-sm-percent", type=int, default=0,
                    help="under CUDA MPS: the SM share of the load's process (0: no limit)")  # fmt: skip
    ap.add_argument("--arrangements", default="same-stream,side-stream,process", help="which, comma-separated")
    args = ap.parse_args(argv)
    seconds = args.seconds
    import torch

    if not torch.cuda.is_available():
        print("bench_stream_share: needs a CUDA GPU (nothing measured here)")
        return
    _decode_steps(1.0)  # warm-up: cuBLAS handles, kernels
    alone = _decode_steps(seconds)
    mps = "MPS on" if os.environ.get("CUDA_MPS_PIPE_DIRECTORY") else "no MPS"
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, {mps}, load SM % {args.load_sm_percent or 100}")
    print("| arrangement | decode ms/step | vs alone | load matmuls/s beside it |")
    print("|---|---|---|---|")
    print(f"| alone | {alone:.2f} | 1.00x | - |")
    for name in args.arrangements.split(","):
        count = [0]
        if name == "process":
            ctx = mp.get_context("spawn")
            started = ctx.Event()
            p = ctx.Process(target=_load_process, args=(seconds + 8, started, args.load_sm_percent))
            p.start()
            started.wait(60)
            time.sleep(1.0)
            ms = _decode_steps(seconds)
            p.terminate()
            p.join()
            rate = "-"
        else:
            stop = threading.Event()
            t = threading.Thread(target=_train_load, args=(stop, seconds + 5, name == "side-stream", count))
            t.start()
            time.sleep(1.0)
            c0, t0 = count[0], time.perf_counter()
            ms = _decode_steps(seconds)
            rate = f"{(count[0] - c0) / (time.perf_counter() - t0):.0f}"
            stop.set()
            t.join()
        print(f"| {name} | {ms:.2f} | {ms / alone:.2f}x | {rate} |", flush=True)


if __name__ == "__main__":
    main()
