"""LoRA adapters on the policy (peft): the warm start's ``sera sft --lora-rank R`` and LoRA RL's
``sera train --lora-rank R``.

An adapter of rank R on every attention and MLP projection (:data:`~common.policy.warmstart.LORA_TARGETS`)
adds ``(alpha / R) * B @ A`` to each projection's weight; only A and B train, the base stays frozen. Its A
matrices start random and its B matrices zero, so the wrapped model starts equal to the base. peft keeps the
adapter in fp32 beside a bf16 base (``autocast_adapter_dtype``), so the optimizer's updates are not rounded
away; an engine that serves it UNMERGED (vLLM's LoRA support, ``level1_batched/vllm_engine.py``) applies
the same fp32 delta instead of merging it into bf16 weights.

Why LoRA for RL here: its state (adapter + AdamW moments: ~30 MB at rank 8 for SmolLM2-135M, against
1.9 GB for full fine-tuning) is small enough to leave a GPU window and continue in the next one. "LoRA
Without Regret" (Schulman et al., 2025) finds that LoRA on all linear layers, even at rank 1, matches full
fine-tuning in RL at about 10x the learning rate. The paper itself fine-tunes every weight: LoRA RL is a
named option (off by default), recorded as a departure when a run uses it.

What a LoRA run's checkpoints hold: :class:`TrainedWeights`, the adapter only (the base is re-made from
``--model`` and ``--init-adapter`` on ``--resume``; the checkpoint records the base it was trained on, the
model's identity and the warm-start adapter's SHA-256, and a resume onto another base is refused in one
line: :func:`common.run.checkpoint.base_mismatch`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch


def add_lora(model: Any, rank: int, alpha: float, seed: int) -> Any:
    """``model`` wrapped with a fresh LoRA adapter of rank ``rank`` (scale ``alpha / rank``) on every
    attention and MLP projection; only the adapter requires a gradient. The A init is seeded by ``seed``
    and leaves the caller's RNG stream untouched."""
    from peft import LoraConfig, get_peft_model

    from common.policy.warmstart import LORA_TARGETS

    lora = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0,
                      target_modules=list(LORA_TARGETS), bias="none", task_type="CAUSAL_LM")  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, lora)


def is_lora(model: Any) -> bool:
    """Whether ``model`` is a peft-wrapped model (an adapter trains on top of a frozen base)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def lora_scale(model: Any) -> float:
    """``alpha / rank`` of the model's (single) adapter."""
    cfg = next(iter(model.peft_config.values()))
    return float(cfg.lora_alpha) / float(cfg.r)


class TrainedWeights:
    """What a LoRA run's checkpoints hold: the adapter's weights only (the base weights never change, and
    the model loads them again on --resume). The ``state_dict`` interface of a module."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self.model)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(self.model, state)
        missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k]
        if missing:
            raise SystemExit(f"--resume: the checkpoint lacks adapter weights {missing[:3]}")


def checkpointed(model: Any) -> Any:
    """What a trainer's checkpoints save and load for ``model``: the adapter of a LoRA model, else the model."""
    return TrainedWeights(model) if is_lora(model) else model


def save_lora_adapter(model: Any, directory: str | Path, base_model_name: str | None = None) -> Path:
    """The adapter in peft's format (``adapter_config.json`` + ``adapter_model.safetensors``, fp32) in
    ``directory``, written to a temporary name and renamed, so a reader never sees half an adapter.
    ``base_model_name`` replaces the local path peft records."""
    import shutil

    target = Path(directory)
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    (tmp / "README.md").unlink(missing_ok=True)  # peft's empty model-card template
    if base_model_name is not None:
        cfg_path = tmp / "adapter_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["base_model_name_or_path"] = base_model_name
        cfg_path.write_text(json.dumps(cfg, indent=2))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def merged_copy_weights(model: Any) -> dict[str, torch.Tensor]:
    """The weights of the base with the adapter merged (``W + (alpha/R) B A``, computed in fp32), under the
    base model's parameter names; the model itself is left unmerged. What the parity test compares a full
    model with."""
    base = model.get_base_model()
    scale = lora_scale(model)
    out: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
            w = module.base_layer.weight.detach().float()
            a = module.lora_A["default"].weight.detach().float()  # [R, in]
            b = module.lora_B["default"].weight.detach().float()  # [out, R]
            out[f"{name}.weight"] = w + scale * (b @ a)
    for name, p in base.named_parameters():
        plain = name.replace(".base_layer.", ".")
        if "lora_" in name or plain in out:
            continue
        out[plain] = p.detach().float()
    return out
