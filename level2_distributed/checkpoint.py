"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP), resumable at another world size.

:class:`DCPCheckpointer` implements :class:`common.run.checkpoint.Checkpointer` (``save`` / ``load_latest``)
for FSDP2 models: every trainer rank calls both methods (they are collectives). Each rank writes only its
own shards of the parameters and of AdamW's state (``get_state_dict`` gives DTensors; DCP writes one file
per rank plus a ``.metadata`` index of which slice of which tensor lives where). Loading reads the slices
each rank needs *now*, so a checkpoint written by 8 ranks loads on 2 (or 1) and vice versa. Rank 0 adds
``run.json`` (the :class:`RunState`: round, policy version, sampler cursor; the config) and its RNG
states, then renames the temp directory, so a kill at any moment leaves the previous checkpoint whole.

What it simplifies: saving is synchronous (``dcp.async_save`` would overlap it with the next step) and
every rank reads the same local filesystem path (on a multi-node cluster ``--out`` must be shared storage,
e.g. NFS, or DCP's fsspec writer pointed at object storage).

    ckpt = DCPCheckpointer(Path("runs/level2"))
    ckpt.save(state, model, optimizer, config)            # on every rank
    state = ckpt.load_latest(model, optimizer, config)    # on every rank; None when there is none
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from common.run.checkpoint import RunState, config_differences


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


class DCPCheckpointer:
    """``out/checkpoints/step_NNNNNN/`` = DCP shards (``__R_0.distcp`` per rank, ``.metadata``) + ``run.json``
    + ``rng.pt``; keeps the last ``keep``."""

    def __init__(self, out: Path, keep: int = 2):
        self.dir, self.keep = Path(out) / "checkpoints", keep

    def latest(self) -> Path | None:
        ckpts = sorted(p for p in self.dir.glob("step_*") if (p / "run.json").exists())
        return ckpts[-1] if ckpts else None

    def save(self, state: RunState, model: Any, optimizer: Any, config: dict[str, Any]) -> None:
        final, tmp = self.dir / f"step_{state.step:06d}", self.dir / f".tmp_step_{state.step:06d}"
        if _rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        _barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)  # this rank's shards (DTensors)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))  # collective
        if _rank() == 0:
            rng = {
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "torch": torch.get_rng_state(),
            }
            torch.save(rng, tmp / "rng.pt")
            world = dist.get_world_size() if dist.is_initialized() else 1
            (tmp / "run.json").write_text(
                json.dumps({"run": asdict(state), "config": config, "world_size": world})
            )
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            for old in sorted(self.dir.glob("step_*"))[: -self.keep]:
                shutil.rmtree(old)
        _barrier()

    def load_latest(self, model: Any, optimizer: Any, config: dict[str, Any]) -> RunState | None:
        path = self.latest()
        if path is None:
            return None
        meta = json.loads((path / "run.json").read_text())
        differences = config_differences(meta["config"], config)  # one line per differing option
        if differences:
            raise SystemExit(
                f"--resume: the config differs from the checkpoint's ({path}):\n" + "\n".join(differences)
            )
        model_sd, optim_sd = get_state_dict(model, optimizer)  # the layout of THIS world size
        sd = {"model": model_sd, "optim": optim_sd}
        dcp.load(sd, checkpoint_id=str(path))  # each rank reads the slices it owns now (resharding)
        set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        rng = torch.load(path / "rng.pt", weights_only=False)
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        return RunState(**meta["run"])


def dcp_model_state(path: Path) -> dict[str, torch.Tensor]:
    """The model's full (unsharded) state dict from a checkpoint ``path``, read in this one process without a
    process group: what ``sera eval --run RUN`` exports a level-2 run's model from
    (``common/run/export.py``). The optimizer's shards are not read."""
    import warnings

    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    with warnings.catch_warnings():  # "torch.distributed is unavailable ...: load in a single process": yes
        warnings.simplefilter("ignore", UserWarning)
        return _load_state_dict_from_keys(keys={"model"}, checkpoint_id=str(path))["model"]
