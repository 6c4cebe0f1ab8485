"""Checkpoints: the interface every tier uses, and the single-process implementation (``torch.save``).

A checkpoint holds what makes a resumed run continue exactly where the killed one stopped: the model, the
optimizer (with its fp32 master weights), the RNG states, and the :class:`RunState` (rollout round, policy
version = the stage clock, task-sampler cursor) plus the config it was made with. It is written to a temp
directory and renamed, so a kill -9 leaves the previous checkpoint intact; the logs are written before the
checkpoint, and :func:`truncate_logs` drops the lines of rounds the checkpoint does not cover.

Level 2 implements the same two methods with ``torch.distributed.checkpoint`` (sharded, resumable at
another world size).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch


@dataclass
class RunState:
    """Where a run stands (all three are restored on --resume)."""

    round: int = 0
    """Rollout rounds done (every loop iteration, with or without an update)."""
    step: int = 0
    """Optimizer steps done = the policy version = the stage clock."""
    cursor: int = 0
    """Tasks drawn from the sampler so far."""


class Checkpointer(Protocol):
    """What a tier needs from checkpoints."""

    def save(self, state: RunState, model: Any, optimizer: Any, config: dict[str, Any]) -> None: ...

    def load_latest(self, model: Any, optimizer: Any, config: dict[str, Any]) -> RunState | None: ...


_LOCKS: dict[str, Any] = {}
"""Open lock files of the run directories this process writes (kept open: the lock lives as long as they do)."""


def lock_out(out: Path) -> None:
    """One writer per run directory: an exclusive ``flock`` on ``out/.lock``, held until this process exits
    (a killed process releases it). A second run on the same directory (say, an earlier one that outlived
    the shell that started it) would interleave its rounds with this one's logs and checkpoints: refused."""
    import fcntl

    key = str(out.resolve())
    if key in _LOCKS:
        return
    f = open(out / ".lock", "a+")  # noqa: SIM115 - kept open on purpose
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise SystemExit(
            f"{out} is being written by another running process; stop it or choose another --out"
        ) from None
    _LOCKS[key] = f


def prepare_out(out: Path, resume: bool) -> None:
    """Refuse to overwrite a run (or a file) by accident, or to write beside a live run; create the directory."""
    if out.exists() and not out.is_dir():
        raise SystemExit(f"--out {out} is a file; give a directory")
    if out.exists() and any(out.glob("checkpoints/step_*")) and not resume:
        raise SystemExit(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    lock_out(out)


def _comparable(config: dict[str, Any]) -> dict[str, Any]:
    """The config keys that must match on --resume (the step target and the resume flag may change)."""
    return {k: v for k, v in config.items() if k not in ("steps", "resume", "max_idle_rounds")}


class TorchCheckpointer:
    """``out/checkpoints/step_NNNNNN/state.pt`` via torch.save; keeps the last ``keep``."""

    def __init__(self, out: Path, keep: int = 2):
        self.dir, self.keep = out / "checkpoints", keep

    def save(self, state: RunState, model: Any, optimizer: Any, config: dict[str, Any]) -> None:
        final, tmp = self.dir / f"step_{state.step:06d}", self.dir / f".tmp_step_{state.step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "run": asdict(state),
                "config": config,
                "rng": {
                    "python": random.getstate(),
                    "numpy": np.random.get_state(),
                    "torch": torch.get_rng_state(),
                },
            },
            tmp / "state.pt",
        )
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in sorted(self.dir.glob("step_*"))[: -self.keep]:
            shutil.rmtree(old)

    def load_latest(self, model: Any, optimizer: Any, config: dict[str, Any]) -> RunState | None:
        ckpts = sorted(self.dir.glob("step_*"))
        if not ckpts:
            return None
        state = torch.load(ckpts[-1] / "state.pt", weights_only=False)
        saved, now = _comparable(state["config"]), _comparable(config)
        if saved != now:
            diff = {
                k: (saved.get(k), now.get(k))
                for k in sorted(set(saved) | set(now))
                if saved.get(k) != now.get(k)
            }
            raise SystemExit(f"--resume: the config differs from the checkpoint's: {diff}")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        torch.set_rng_state(state["rng"]["torch"])
        return RunState(**state["run"])


def truncate_logs(out: Path, round: int) -> None:
    """Drop log lines of rounds >= ``round`` (written by a run killed before that round's checkpoint), so a
    resumed run neither loses nor duplicates a round. A torn last line is dropped too."""
    for name, round_of in (
        ("metrics.jsonl", lambda r: r["round"]),
        ("trees.jsonl", lambda r: r["meta"]["round"]),
    ):
        path = out / name
        if not path.exists():
            continue
        keep = []
        for line in path.read_text().splitlines(keepends=True):
            if line.endswith("\n") and line.strip() and round_of(json.loads(line)) < round:
                keep.append(line)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(keep))
        os.replace(tmp, path)
