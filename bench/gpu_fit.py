"""How many level-1 runs fit on this GPU at once, and the share of the card each gets (issue #49).

A run's peak on the card (its vLLM engine and its trainer together, ``mem/gpu_run_gib``) is measured once per
model and training setting and written in ``bench/gpu_fit.tsv``; the drivers (bench/learning.sh,
bench/tiny_set.sh, bench/bench_gpu_share.py) read it, read the card's memory (``nvidia-smi``), and start at
most as many runs at once as fit with a margin; the rest wait for a slot. Each run is given
``--gpu-share BUDGET / CARD`` and sizes its trainer to it (common/run/trainer_memory.py). A run that cannot
fit the card at all is refused in one line before anything starts.

    python bench/gpu_fit.py --runs 4 --model smollm2 --train lora        # -> SLOTS=4 SHARE=0.2021 RUN_GIB=16
    GPU_TOTAL_GIB=24 python bench/gpu_fit.py --runs 4 --train full       # a 24 GiB card: fewer at once
    python bench/gpu_fit.py --runs 2 --run-gib 40                        # a budget of your own, no table
    GPU_RESERVED_GIB=20 python bench/gpu_fit.py --runs 4 --train lora    # 20 GiB kept for another job

Prints shell assignments (``eval "$(python bench/gpu_fit.py ...)"``); exit 2 with one line on stderr when
one run does not fit.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
from pathlib import Path

TABLE = Path(__file__).with_name("gpu_fit.tsv")
MARGIN_GIB = 2.0
"""Kept free on the card besides the runs' budgets (the driver, NVML, fragmentation between processes)."""


def card_total_gib() -> float:
    """The GPU's memory in GiB: ``GPU_TOTAL_GIB`` when set (tests, or to plan for another card), else the
    first GPU ``nvidia-smi`` lists; 0 when there is none."""
    if os.environ.get("GPU_TOTAL_GIB"):
        return float(os.environ["GPU_TOTAL_GIB"])
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout  # fmt: skip
        return float(out.splitlines()[0]) / 1024  # MiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return 0.0


def run_budget_gib(model: str, train: str, table: Path = TABLE) -> float:
    """The budget (GiB) of one run of ``model`` trained as ``train`` (``lora`` or ``full``) from the table:
    its measured peak plus headroom, the ``budget_gib`` column. A pair the table lacks: the ``*`` row of that
    ``train``, else an error naming the file.

    >>> run_budget_gib("smollm2", "lora")
    16.0
    """
    rows = list(csv.DictReader((ln for ln in table.read_text().splitlines() if not ln.startswith("#")), delimiter="\t"))
    for key in (model, "*"):
        for r in rows:
            if r["model"] == key and r["train"] == train:
                return float(r["budget_gib"])
    raise SystemExit(f"gpu_fit: no row for model {model!r}, train {train!r} in {table} (add one, or pass --run-gib)")


def fit(runs: int, run_gib: float, total_gib: float, reserved_gib: float = 0.0) -> tuple[int, float]:
    """``(slots, share)``: how many of ``runs`` runs of ``run_gib`` fit at once on a ``total_gib`` card
    (keeping :data:`MARGIN_GIB` free, and ``reserved_gib`` for other jobs on the card), and the share of the
    whole card each gets. One run that does not fit raises ``ValueError``.

    >>> fit(4, 16.0, 79.2)
    (4, 0.202)
    >>> fit(7, 16.0, 79.2)            # 4 at once, the other 3 wait
    (4, 0.202)
    >>> fit(2, 16.0, 23.6)
    (1, 0.678)
    >>> fit(4, 16.0, 79.2, reserved_gib=20.0)   # 20 GiB kept for a job beside them: 3 at once
    (3, 0.202)
    """
    usable = total_gib - MARGIN_GIB - reserved_gib
    if run_gib > usable:
        raise ValueError(
            f"one run needs {run_gib:g} GiB and this card has {total_gib:.1f} GiB ({usable:.1f} usable"
            f"{f', {reserved_gib:g} kept for other jobs' if reserved_gib else ''}): "
            "nothing started (a smaller model, LoRA, or a larger card)"
        )
    slots = max(1, min(runs, int(usable // run_gib)))
    return slots, round(run_gib / total_gib, 3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, required=True, help="runs the driver wants to start")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--train", choices=("lora", "full"), default="full", help="--lora-rank given: lora")
    ap.add_argument("--run-gib", type=float, default=None, help="a run's budget (default: the table's)")
    a = ap.parse_args(argv)
    total = card_total_gib()
    if total <= 0:
        print("gpu_fit: no GPU found (nvidia-smi); set GPU_TOTAL_GIB to plan for one", file=sys.stderr)
        return 2
    run_gib = a.run_gib if a.run_gib is not None else run_budget_gib(a.model, a.train)
    try:
        slots, share = fit(a.runs, run_gib, total, float(os.environ.get("GPU_RESERVED_GIB") or 0))
    except ValueError as e:
        print(f"gpu_fit: {e}", file=sys.stderr)
        return 2
    print(f"SLOTS={slots} SHARE={share} RUN_GIB={run_gib:g} CARD_GIB={total:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
