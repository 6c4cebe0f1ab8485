"""The model of a training run, as a directory ``sera eval`` loads: ``sera eval --run RUN`` (issue #52.2).

A run directory (``sera train --out RUN``, any level, full fine-tuning or LoRA; ``sera sft --out RUN``) holds
checkpoints, not a model: ``RUN/checkpoints/step_NNNNNN/`` with ``state.pt`` (levels 0 and 1, ``sera sft``:
:class:`~common.run.checkpoint.TorchCheckpointer`) or DCP shards + ``run.json`` (level 2). Its
``config.json`` says what the checkpoint's weights sit on:

* full fine-tuning: the checkpoint holds every weight; the base model (``model``, ``seed``) gives only the
  architecture and the tokenizer;
* LoRA (``lora_rank`` > 0): the checkpoint holds the adapter alone, trained on top of the base model with the
  run's warm-start adapter merged in (``init_weights.adapter`` in ``config.json``; ``sera sft`` starts from
  the plain base); the export merges the trained adapter too.

:func:`find_run_checkpoint` recognises a run directory, or one of its ``checkpoints/step_*`` directories;
:func:`export_run_model` writes that checkpoint's model once to ``RUN/export/step_NNNNNN/`` (an ordinary HF
model directory, float32, with ``sera_export.json`` naming the checkpoint it came from) and reuses it while
the checkpoint is unchanged. Level 2's shards are read by a loader the CLI passes in
(``level2_distributed.checkpoint.dcp_model_state``): ``common/`` never imports torch.distributed.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXPORT_RECORD = "sera_export.json"
"""The file beside an exported model that names the checkpoint it was made from."""


@dataclass
class RunCheckpoint:
    """One checkpoint of a training run."""

    run_dir: Path
    checkpoint: Path
    """``RUN/checkpoints/step_NNNNNN``."""
    step: int
    config: dict[str, Any]
    """The run's ``config.json``."""
    form: str
    """``torch`` (``state.pt``: levels 0 and 1, sft) or ``dcp`` (level 2's shards)."""

    @property
    def level(self) -> int:
        return 2 if "level2" in self.config else 1 if "level1" in self.config else 0

    @property
    def lora_rank(self) -> int:
        return int(self.config.get("lora_rank") or 0)

    def describe(self) -> str:
        what = "sft" if "trees_per_task" in self.config else f"level {self.level}"
        weights = f"LoRA r{self.lora_rank} adapter" if self.lora_rank else "every weight"
        return f"{self.run_dir} ({what}, {weights}, model {self.config.get('model')}): step {self.step}"


def _run_config(run_dir: Path) -> dict[str, Any] | None:
    """A run's ``config.json``, or None where ``run_dir`` is no run directory (a model directory's
    config.json has ``model_type``; a run's has ``model`` and ``env``)."""
    path = run_dir / "config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(config, dict) or "model_type" in config or not {"model", "env"} <= set(config):
        return None
    return config


def find_run_checkpoint(path: str | Path) -> RunCheckpoint | None:
    """The checkpoint ``path`` names: a run directory (its newest checkpoint) or a ``checkpoints/step_*``
    directory of one; None where ``path`` is neither (say, a model directory). A run without a checkpoint
    raises a one-line ``FileNotFoundError``."""
    path = Path(path).expanduser()
    if path.parent.name == "checkpoints" and path.name.startswith("step_") and path.is_dir():
        run_dir, chosen = path.parent.parent, path
    else:
        run_dir, chosen = path, None
    config = _run_config(run_dir)
    if config is None:
        return None
    if chosen is None:
        steps = sorted(
            p for p in (run_dir / "checkpoints").glob("step_*") if (p / "state.pt").is_file() or (p / "run.json").is_file()
        )
        if not steps:
            raise FileNotFoundError(
                f"{run_dir} is a training run without a checkpoint yet (no optimizer step was saved in "
                f"{run_dir / 'checkpoints'}): there is no trained model to evaluate"
            )
        chosen = steps[-1]
    if (chosen / "state.pt").is_file():
        form = "torch"
    elif (chosen / "run.json").is_file():
        form = "dcp"
    else:
        raise FileNotFoundError(f"{chosen} holds neither state.pt nor run.json: not a whole checkpoint")
    return RunCheckpoint(run_dir, chosen, int(chosen.name.split("_")[-1]), config, form)


def _fingerprint(checkpoint: Path) -> list[list[Any]]:
    """Names, sizes and modification times of a checkpoint's files: a rewritten checkpoint is exported again."""
    return [
        [str(p.relative_to(checkpoint)), p.stat().st_size, p.stat().st_mtime_ns]
        for p in sorted(checkpoint.rglob("*"))
        if p.is_file()
    ]


def export_dir(ck: RunCheckpoint) -> Path:
    return ck.run_dir / "export" / ck.checkpoint.name


def _strip(state: dict[str, Any]) -> dict[str, Any]:
    """Wrapper prefixes a trainer may leave on parameter names (DDP, torch.compile, activation checkpointing)."""
    out = {}
    for k, v in state.items():
        for junk in ("module.", "_orig_mod.", "_checkpoint_wrapped_module."):
            k = k.replace(junk, "")
        out[k] = v
    return out


def _start_adapter(ck: RunCheckpoint) -> str | None:
    """The warm-start adapter a LoRA run's adapter trained on top of (None for the plain base model)."""
    from common.policy.warmstart import adapter_sha256, resolve_init

    record = ck.config.get("init_weights") or {}
    adapter = record.get("adapter")
    if adapter and Path(adapter).is_dir():
        if record.get("adapter_sha256") and adapter_sha256(Path(adapter)) != record["adapter_sha256"]:
            raise ValueError(
                f"{ck.run_dir} started from the warm-start adapter {adapter}, which has changed since (its "
                "SHA-256 differs from config.json's): the run's LoRA checkpoint cannot be rebuilt on it"
            )
        return adapter
    if adapter:  # moved: the run's own --init-adapter again (auto finds the shipped one on this machine)
        init = resolve_init(ck.config.get("init_adapter"), ck.config["model"], ck.config["env"], ck.config.get("seed", 0))
        if init.sha256 != record.get("adapter_sha256"):
            raise FileNotFoundError(
                f"{ck.run_dir} started from the warm-start adapter {adapter}, which is not on this machine"
            )
        return init.adapter
    return None


def export_run_model(ck: RunCheckpoint, dcp_loader: Callable[[Path], dict[str, Any]] | None = None) -> Path:
    """``ck``'s model as an HF model directory (``RUN/export/step_NNNNNN``), written once per checkpoint.
    ``dcp_loader``: reads the model's state dict from a level-2 checkpoint (needed for those only)."""
    target = export_dir(ck)
    fingerprint = _fingerprint(ck.checkpoint)
    record_path = target / EXPORT_RECORD
    if record_path.is_file() and any(target.glob("*.safetensors")):
        try:
            if json.loads(record_path.read_text()).get("files") == fingerprint:
                return target
        except (OSError, json.JSONDecodeError):
            pass
    import torch

    from common.policy.lora import TrainedWeights, add_lora
    from common.policy.models import load_model, write_model_dir

    if ck.form == "torch":
        state = torch.load(ck.checkpoint / "state.pt", mmap=True, weights_only=False, map_location="cpu")["model"]
    else:
        if dcp_loader is None:
            raise ValueError(f"{ck.checkpoint} is a level-2 (DCP) checkpoint; it needs level 2's loader")
        state = dcp_loader(ck.checkpoint)
    state = _strip(state)
    seed = int(ck.config.get("seed", 0))
    if ck.lora_rank:
        model, tokenizer = load_model(ck.config["model"], dtype="float32", seed=seed, adapter=_start_adapter(ck))
        model = add_lora(model, ck.lora_rank, float(ck.config.get("lora_alpha", 32.0)), seed)
        TrainedWeights(model).load_state_dict(state)
        model = model.merge_and_unload()
    else:
        model, tokenizer = load_model(ck.config["model"], dtype="float32", seed=seed)
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
        if missing or unexpected:
            raise ValueError(
                f"{ck.checkpoint} does not fit model {ck.config['model']}: missing {missing[:3]}, "
                f"unexpected {unexpected[:3]}"
            )
    record = {"checkpoint": str(ck.checkpoint.resolve()), "step": ck.step, "level": ck.level,
              "lora_rank": ck.lora_rank, "model": ck.config["model"], "files": fingerprint}  # fmt: skip
    if target.exists():
        shutil.rmtree(target)
    return write_model_dir(model.to(torch.float32), tokenizer, target, {EXPORT_RECORD: json.dumps(record, indent=2)})
