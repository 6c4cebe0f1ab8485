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


def is_locked(out: Path) -> bool:
    """Whether another process holds ``out``'s lock (:func:`lock_out`) now; never takes it."""
    import fcntl

    if str(out.resolve()) in _LOCKS or not (out / ".lock").is_file():
        return False
    with open(out / ".lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


LOGS = ("metrics.jsonl", "trees.jsonl")
"""The per-round logs of a run (what --resume truncates to its checkpoint and a fresh run would replace)."""


def run_outputs(out: Path) -> list[str]:
    """Names of what a run directory holds, the lock file aside (sorted; empty for a missing directory)."""
    if not out.is_dir():
        return []
    return sorted(p.name for p in out.iterdir() if p.name != ".lock")


def has_checkpoint(out: Path) -> bool:
    """Whether ``out`` holds a checkpoint any tier can resume from (``checkpoints/step_*``)."""
    return any((out / "checkpoints").glob("step_*"))


def logged_rounds(out: Path) -> int:
    """Complete lines of ``out/metrics.jsonl`` (one per rollout round or evaluation row)."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return 0
    with open(path, "rb") as f:
        return sum(1 for line in f if line.endswith(b"\n") and line.strip())


def _has_logs(out: Path) -> bool:
    return any((out / n).exists() and (out / n).stat().st_size > 0 for n in LOGS)


def _listing(names: list[str], n: int = 4) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def check_run_dir(out: Path, resume: bool, overwrite: bool = False) -> str | None:
    """Decide what may happen to run directory ``out`` before anything is written or loaded.

    Raises ``ValueError`` (one line, naming the fix) when the run would replace output it was not asked to:

    * ``out`` is a file;
    * ``out`` holds anything (metrics, trees, curves, config, checkpoints) and neither ``--resume`` nor
      ``--overwrite`` was given (a default CPU run never writes a checkpoint; its logs count as a run too);
    * ``--resume`` together with ``--overwrite``.

    Returns the one-line note to print when ``--resume`` has no checkpoint to continue from (then a run
    starts at step 0: in an empty directory, or over logged rounds no checkpoint covers, which a resumed
    run always redoes), else None. ``--overwrite`` is the caller's to carry out (:func:`clear_run_dir`)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a directory")
    if is_locked(out):
        raise ValueError(f"{out} is being written by another running process; stop it or choose another --out")
    if resume and overwrite:
        raise ValueError(
            f"--resume and --overwrite contradict each other: --resume continues the run in {out}, "
            "--overwrite deletes it; give one"
        )
    held = run_outputs(out)
    if overwrite:
        return None
    if not held:
        return f"--resume: {out} holds no run yet; starting a fresh one there" if resume else None
    rounds = logged_rounds(out)
    logged = f"{rounds} logged round{'s' if rounds != 1 else ''}"
    if not resume:
        if has_checkpoint(out):
            raise ValueError(
                f"{out} already holds a run ({_listing(held)}); pass --resume to continue it, --overwrite "
                "to delete it and start again, or choose another --out"
            )
        raise ValueError(
            f"{out} already holds a run ({_listing(held)}: {logged}, no checkpoint); choose another --out to "
            "keep it, or pass --overwrite to delete it and start again (--resume would start again from "
            "step 0 too: there is no checkpoint to continue from)"
        )
    if has_checkpoint(out):
        return None
    if _has_logs(out):
        return (
            f"--resume: {out} holds no checkpoint yet ({logged}, no optimizer step saved); starting again "
            "from step 0, those rounds are redone and their log lines replaced"
        )
    return f"--resume: {out} holds no checkpoint and no logged round yet; starting a fresh run there"


RUN_MARKERS = ("config.json", "metrics.jsonl", "trees.jsonl", "checkpoints", "curves.png", "sft_data.jsonl")
"""Files only a run writes: ``--overwrite`` deletes a directory only if it holds one of them."""


def clear_run_dir(out: Path) -> None:
    """``--overwrite``: delete what ``out`` holds (under its lock, so never beside a live run). Refused for a
    directory that does not look like a run directory (say ``--out .``), so a typo cannot wipe a tree."""
    held = run_outputs(out)
    if not held:
        return
    here = Path.cwd().resolve()
    target = out.resolve()
    if target == here or target in here.parents or target == Path.home().resolve():
        raise ValueError(f"--overwrite: {out} is the current directory, one of its parents or your home")
    if not any(n in RUN_MARKERS for n in held):
        raise ValueError(
            f"--overwrite: {out} does not look like a run directory (it holds {_listing(held)} but none of "
            f"{', '.join(RUN_MARKERS)}); delete it yourself or choose another --out"
        )
    lock_out(out)
    for name in held:
        p = out / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def prepare_out(out: Path, resume: bool, overwrite: bool = False) -> None:
    """Refuse to replace a run (or a file) by accident, or to write beside a live run; create the directory.

    See :func:`check_run_dir` for what is refused; ``overwrite`` deletes what the directory holds first."""
    try:
        note = check_run_dir(out, resume, overwrite)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    out.mkdir(parents=True, exist_ok=True)
    lock_out(out)
    if overwrite:
        try:
            clear_run_dir(out)
        except ValueError as e:
            raise SystemExit(str(e)) from None
    if note:
        print(note, flush=True)


RESUMABLE_CHANGES = (
    "steps", "resume", "max_idle_rounds", "init_adapter", "keep_checkpoints", "optimizer_state", "out",
    "resolved_base", "forward_tokens", "time_limit_s",
)  # fmt: skip
"""Settings a --resume may change: the step target, the resume flag, the idle and time limits, --init-adapter (the
starting weights of a resumed full-weight run are its checkpoint's; a LoRA run's base is checked on its own,
:func:`base_mismatch`), how many checkpoints are kept, where the optimizer's state lives (either checkpoint
form loads into either), `sera sft`'s --forward-tokens (how examples share a forward pass: the same
gradient up to rounding; absent from checkpoints made before it) and --out: the directory is where a run lives, not a setting of it, so a run moved
(``mv run run2``) resumes with ``--out run2 --resume``."""


def with_base(config: dict[str, Any], init: Any) -> dict[str, Any]:
    """``config`` plus the base the run's weights were built on (``resolved_base``: the model's identity and
    the SHA-256 of the warm-start adapter merged into it, None for none; ``init``: an
    :class:`~common.policy.warmstart.InitWeights`). Every checkpoint records it; a LoRA checkpoint holds only
    its adapter, so a LoRA ``--resume`` refuses another base (:func:`base_mismatch`)."""
    return {**config, "resolved_base": {"model": init.base_key, "adapter_sha256": init.sha256}}


def base_mismatch(saved: dict[str, Any], now: dict[str, Any]) -> str | None:
    """The one line that refuses a LoRA ``--resume`` onto a base other than the one its adapter was trained
    on (another --model identity, another warm-start adapter, or one where there was none: what
    ``--init-adapter`` resolves to is compared, not its spelling, so ``auto`` meeting a changed shipped
    adapter is refused); None when they agree, for full-weight runs (their checkpoint holds every weight),
    and for a checkpoint made before bases were recorded (a note is printed: it cannot be checked).

    >>> a = {"lora_rank": 8, "init_adapter": "auto", "resolved_base": {"model": "smollm2", "adapter_sha256": "ab" * 32}}
    >>> b = {"lora_rank": 8, "init_adapter": "none", "resolved_base": {"model": "smollm2", "adapter_sha256": None}}
    >>> print(base_mismatch(a, b))  # doctest: +NORMALIZE_WHITESPACE
    --resume: this LoRA run's adapter was trained on smollm2 + warm-start adapter sha256 abababababab
    (--init-adapter 'auto'), but this run builds smollm2 + no warm-start adapter (--init-adapter 'none');
    resume with the base it was trained on, or start a new --out
    >>> base_mismatch(a, a) is None, base_mismatch({**a, "lora_rank": 0}, {**b, "lora_rank": 0}) is None
    (True, True)
    """
    if not now.get("lora_rank"):
        return None
    old, new = saved.get("resolved_base"), now.get("resolved_base")
    if old is None:
        print("--resume: this LoRA checkpoint predates base records; its base cannot be checked", flush=True)
        return None
    if old == new:
        return None

    def show(base: dict[str, Any] | None, config: dict[str, Any]) -> str:
        sha = (base or {}).get("adapter_sha256")
        adapter = f"warm-start adapter sha256 {sha[:12]}" if sha else "no warm-start adapter"
        return f"{(base or {}).get('model')} + {adapter} (--init-adapter {config.get('init_adapter')!r})"

    return (
        f"--resume: this LoRA run's adapter was trained on {show(old, saved)}, but this run builds "
        f"{show(new, now)}; resume with the base it was trained on, or start a new --out"
    )


def _comparable(config: dict[str, Any]) -> dict[str, Any]:
    """The config keys that must match on --resume (all but :data:`RESUMABLE_CHANGES`, at any depth)."""
    return {
        k: _comparable(v) if isinstance(v, dict) else v for k, v in config.items() if k not in RESUMABLE_CHANGES
    }


def _fsync(path: Path) -> None:
    """Flush a file's (or a directory's entries') data to the disk, so a rename after it is never of a
    half-written file after a power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def config_differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """One line per setting that differs between a run's saved config and this one (the settings
    :func:`_comparable` keeps), named as the CLI spells it: ``--lr: 1e-05 in the run, 0.001 now``.
    Nested groups (``rollout``, ``optim``) are flattened to their fields' names."""

    def flat(config: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in _comparable(config).items():
            if isinstance(v, dict):
                out.update(v)
            else:
                out[k] = v
        return out

    def show(v: Any) -> str:
        return repr(v) if isinstance(v, str) else str(v)

    a, b = flat(json.loads(json.dumps(saved))), flat(json.loads(json.dumps(now)))  # tuples read back as lists
    return [
        f"--{k.replace('_', '-')}: {show(a.get(k))} in the run, {show(b.get(k))} now"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    ]


class TorchCheckpointer:
    """``out/checkpoints/step_NNNNNN/state.pt`` via torch.save; keeps the newest ``keep`` (0 = all;
    ``--keep-checkpoints``, default 1).

    Written to ``.tmp_step_NNNNNN/`` (flushed to the disk) and renamed, so a crash while writing leaves the
    checkpoints before it whole; older ones are deleted only after that rename and once the new one reads
    back (:func:`readable`; for a moment the disk holds one more). On --resume a damaged newest checkpoint (a truncated file, a disk error) is named and the
    newest intact one before it is used (there is one with ``keep`` >= 2)."""

    def __init__(self, out: Path, keep: int = 1):
        if keep < 0:
            raise ValueError(f"keep must be >= 0 (0 = keep every checkpoint), got {keep}")
        self.dir, self.keep = out / "checkpoints", keep

    def save(self, state: RunState, model: Any, optimizer: Any, config: dict[str, Any]) -> None:
        final, tmp = self.dir / f"step_{state.step:06d}", self.dir / f".tmp_step_{state.step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        offloaded = getattr(optimizer, "offload_dir", None) is not None  # --optimizer-state disk
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(into=tmp) if offloaded else optimizer.state_dict(),
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
        _fsync(tmp / "state.pt")
        if offloaded:  # the optimizer's files, linked into the checkpoint: on the disk before the rename
            for f in sorted((tmp / "optimizer_state").iterdir()):
                _fsync(f)
            _fsync(tmp / "optimizer_state")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync(self.dir)
        readable(final)  # the new checkpoint reads back whole: only now do older ones go
        if self.keep:
            for old in sorted(self.dir.glob("step_*"))[: -self.keep]:
                shutil.rmtree(old)

    def load_latest(self, model: Any, optimizer: Any, config: dict[str, Any]) -> RunState | None:
        ckpts = sorted(self.dir.glob("step_*"))
        if not ckpts:
            return None
        damaged = []
        for path in reversed(ckpts):
            try:
                state = torch.load(path / "state.pt", weights_only=False)
                run = RunState(**state["run"])
                for name, size in state["optimizer"].get("files", {}).items():  # --optimizer-state disk
                    if (path / name).stat().st_size != size:
                        raise OSError(f"{name} has {(path / name).stat().st_size} bytes, not {size}")
            except Exception as e:  # noqa: BLE001 - a truncated zip, an unpickling error, a missing file
                reason = (str(e).strip().splitlines() or [""])[0][:160]
                print(f"--resume: {path / 'state.pt'} is damaged ({type(e).__name__}: {reason})", flush=True)
                damaged.append(path.name)
                continue
            if damaged:
                print(
                    f"--resume: resuming from {path} (step {run.step}), the newest intact checkpoint; "
                    f"the rounds after it are redone",
                    flush=True,
                )
            break
        else:
            run_dir = self.dir.parent
            raise SystemExit(
                f"--resume: every checkpoint in {self.dir} is damaged ({', '.join(damaged)}), so there is no "
                f"step to continue from. To start again from step 0 and keep what {run_dir} holds, give "
                f"another --out; to start again here keeping the damaged files, move them aside "
                f"(mv {self.dir} {run_dir / 'checkpoints.damaged'}) and --resume again (the logged rounds are "
                "redone); --overwrite deletes the whole run"
            )
        differences = config_differences(state["config"], config)
        if differences:
            raise SystemExit("--resume: the config differs from the checkpoint's:\n" + "\n".join(differences))
        if (refused := base_mismatch(state["config"], config)) is not None:
            raise SystemExit(refused)
        model.load_state_dict(state["model"])
        if "offloaded" in state["optimizer"]:
            optimizer.load_state_dict(state["optimizer"], path)
        else:
            optimizer.load_state_dict(state["optimizer"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        torch.set_rng_state(state["rng"]["torch"])
        return run


def readable(checkpoint: Path) -> None:
    """Raise unless ``checkpoint/state.pt`` loads back (a memory-mapped read: the archive's index and every
    record's header, not the tensors' bytes) and names its step; what :meth:`TorchCheckpointer.save` checks
    before it deletes an older checkpoint, so a write the disk got wrong never leaves a run without one."""
    state = torch.load(checkpoint / "state.pt", mmap=True, weights_only=False, map_location="cpu")
    RunState(**state["run"])


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
