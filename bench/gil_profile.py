"""Who holds the GIL in a running process (issue #53): a summary of py-spy's ``--gil --threads --format raw``.

py-spy samples a live process from outside (no restart, no code change); with ``--gil`` it keeps only the
samples of the thread holding the GIL at that instant, so each thread's sample count over the window's
``seconds x rate`` samples is its share of the GIL, and what is left is time when no thread held it (every
thread waiting: on the GPU, a socket, a lock). A level-1 process with ``--max-staleness 1`` has the trainer on
its main thread and the rollouts (``rollouts-round<N>``: the asyncio loop of the trees) and vLLM's stepper
(``vllm-stepper``) beside it; if the trainer's share is large while rounds roll out, the rollouts wait for it
(and the other way round).

    py-spy record --pid PID --duration 20 --rate 100 --threads --gil --nonblocking --format raw -o gil.txt
    python bench/gil_profile.py gil.txt --seconds 20 --rate 100        # share per thread, top frames of each
    PROFILE_AT=3 bash bench/gpu_share_call.sh start                     # every run of each bench_gpu_share set, mid-set

Simplifications: ``--nonblocking`` (the process is not paused per sample, so it runs at its own speed; a
sample may mix frames of two instants), native frames (C++/CUDA) not unwound: a thread inside a C call that
keeps the GIL shows its last Python frame.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import typer

LINE = re.compile(r"^thread \((?P<tid>[^)]*)\): (?P<name>[^;]*)(?P<stack>;.*)? (?P<n>\d+)$")


def find_py_spy() -> str | None:
    """The py-spy program: ``$SPY``, then PATH, then beside this interpreter, then where bench/bundle_h200.sh
    installs it (``/tmp/site/bin/py-spy``); None when none exists."""
    for c in (os.environ.get("SPY"), shutil.which("py-spy"), str(Path(sys.executable).parent / "py-spy"),
              "/tmp/site/bin/py-spy"):  # fmt: skip
        if c and Path(c).is_file():
            return c
    return None


def summarize(text: str, seconds: float, rate: float, top: int = 6) -> str:
    """A markdown table of each thread's GIL share (its samples / ``seconds * rate``) and its ``top`` leaf frames.

    >>> raw = "thread (7): MainThread;train (t.py:3);step (t.py:9) 60\\nthread (8): vllm-stepper;run (v.py:2) 20\\n"
    >>> print(summarize(raw, seconds=1, rate=100))
    | thread | GIL share | samples | top frames (samples) |
    |---|---|---|---|
    | MainThread | 0.60 | 60 | step (t.py:9) 60 |
    | vllm-stepper | 0.20 | 20 | run (v.py:2) 20 |
    | (no thread) | 0.20 | 20 | |
    """
    per: dict[str, dict[str, int]] = {}
    bad = 0
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if not m:
            bad += bool(line.strip())
            continue
        name = re.sub(r"\d+$", "N", m["name"]) if m["name"].startswith("rollouts-round") else m["name"]
        leaf = (m["stack"] or ";(no frame)").rsplit(";", 1)[1]
        frames = per.setdefault(name, {})
        frames[leaf] = frames.get(leaf, 0) + int(m["n"])
    window = max(1.0, seconds * rate)
    rows = ["| thread | GIL share | samples | top frames (samples) |", "|---|---|---|---|"]
    held = 0
    for name, frames in sorted(per.items(), key=lambda kv: -sum(kv[1].values())):
        n = sum(frames.values())
        held += n
        best = sorted(frames.items(), key=lambda kv: -kv[1])[:top]
        rows.append(f"| {name} | {n / window:.2f} | {n} | {'; '.join(f'{f} {c}' for f, c in best)} |")
    rows.append(f"| (no thread) | {max(0.0, 1 - held / window):.2f} | {max(0, int(window) - held)} | |")
    if bad:
        rows.append(f"\n{bad} line(s) not in py-spy's raw format (thread (TID): NAME;frames COUNT) left out")
    return "\n".join(rows)


def main(
    raw: Path = typer.Argument(..., help="py-spy record --gil --threads --format raw output"),
    seconds: float = typer.Option(..., help="the recording's --duration"),
    rate: float = typer.Option(100.0, help="the recording's --rate (samples per second)"),
    top: int = typer.Option(6, help="leaf frames shown per thread"),
) -> None:
    if not raw.exists():
        typer.echo(f"gil_profile: no file {raw} (did py-spy attach? it needs ptrace rights)", err=True)
        raise typer.Exit(2)
    print(summarize(raw.read_text(errors="replace"), seconds, rate, top))


if __name__ == "__main__":
    sys.exit(typer.run(main))
