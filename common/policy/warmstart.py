"""Warm-start adapters: which weights a run starts from (``--init-adapter PATH|auto|none``).

A warm-start adapter is a LoRA adapter in peft's standard format (``adapter_config.json`` +
``adapter_model.safetensors``) written by ``sera sft --lora-rank R`` to ``OUT/adapter/``, with one more
file beside them, ``sera_adapter.json``, saying which base model and environment it was made for. A run
starts from it by merging it into the base model's weights when the model loads
(``PeftModel.from_pretrained(base, dir).merge_and_unload()``); from there everything is as without it
(full-weight RL on the merged model, a level-1 vLLM engine started from those weights, ...).

    --init-adapter auto    (default) the adapter shipped with this package for the run's model and
                           environment (``common/assets/warmstart/*/``), else the plain base model
    --init-adapter none    the plain base model
    --init-adapter PATH    that adapter directory; made for another base model or environment: an error

Every run says in one line which weights it started from (:meth:`InitWeights.line`) and records it in
its ``config.json`` (:meth:`InitWeights.record`). The shipped adapters are package data: they are found
through this package's path, never the current directory.

Base models are compared by a key (:func:`model_key`): the alias (``smollm2``), ``tiny@seed0`` for the
seeded in-memory test models, the absolute path of a model directory, or the HF id.

Simplifications: one adapter per run (no stacking); the merge is done in float32 and the result cast to
the run's dtype; an adapter without ``sera_adapter.json`` (made elsewhere) is refused, since nothing would
say which model it belongs to.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RECORD = "sera_adapter.json"
"""The file beside a peft adapter that says what it was made for (written by ``sera sft --lora-rank``)."""
PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")
"""peft's standard adapter files."""
PROVENANCE = "record.json"
"""A shipped adapter's provenance (the command, data, commit and held-out numbers that made it)."""
FORMAT = "sera-warmstart-adapter/1"
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers a warm-start adapter adapts (every attention and MLP projection of a Llama block)."""


def shipped_root() -> Path:
    """Where the shipped adapters live: ``common/assets/warmstart`` inside the installed package."""
    import common

    return Path(common.__file__).resolve().parent / "assets" / "warmstart"


def model_key(name: str, seed: int = 0) -> str:
    """The identity of a base model, as adapters record it: an alias (``smollm2``), ``tiny@seed0`` for a
    seeded in-memory model, the absolute path of a local model directory, or the HF id unchanged.

    >>> model_key("SmolLM2-135M-Instruct"), model_key("tiny", seed=3)
    ('smollm2', 'tiny@seed3')
    """
    from common.policy.models import ALIASES, IN_MEMORY

    alias = ALIASES.get(name.lower())
    if alias in IN_MEMORY:
        return f"{alias}@seed{seed}"
    if alias:
        return alias
    path = Path(name).expanduser()
    return str(path.resolve()) if path.is_dir() else name


def read_record(adapter: Path) -> dict[str, Any]:
    """``sera_adapter.json`` of an adapter directory; one-line errors for what is not an adapter."""
    if not adapter.exists():
        raise FileNotFoundError(f"--init-adapter {adapter} does not exist")
    if not adapter.is_dir():
        raise NotADirectoryError(f"--init-adapter {adapter} is a file; give an adapter directory")
    missing = [n for n in (*PEFT_FILES, RECORD) if not (adapter / n).is_file()]
    if missing:
        raise ValueError(
            f"--init-adapter {adapter} is not a warm-start adapter made by `sera sft --lora-rank R` "
            f"(missing {', '.join(missing)})"
        )
    try:
        record = json.loads((adapter / RECORD).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{adapter / RECORD}:{e.lineno}: invalid JSON: {e.msg}") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{adapter / RECORD} is not a {FORMAT} record")
    return record


def adapter_sha256(adapter: Path) -> str:
    """SHA-256 of the adapter's weights file (what config.json and eval manifests pin)."""
    h = hashlib.sha256()
    with open(adapter / "adapter_model.safetensors", "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class InitWeights:
    """The weights a run starts from: a base model, with or without a merged warm-start adapter."""

    asked: str
    """What --init-adapter said: auto | none | a path."""
    model: str
    """The run's --model."""
    base_key: str
    """:func:`model_key` of ``model``."""
    env: str
    """The run's environment."""
    adapter: str | None = None
    """The adapter directory merged in (absolute), or None for the plain base model."""
    shipped: bool = False
    """Whether ``adapter`` is one shipped with the package (``auto``)."""
    sha256: str | None = None
    """SHA-256 of the adapter's weights file."""
    info: dict[str, Any] | None = None
    """The adapter's ``sera_adapter.json``."""
    provenance: dict[str, Any] | None = None
    """A shipped adapter's ``record.json`` (command, data, commit, held-out numbers), when it has one."""

    def line(self) -> str:
        """The one line a run prints about its starting weights."""
        if self.adapter is None:
            why = (
                f"no warm-start adapter for {self.base_key} on {self.env} is shipped"
                if self.asked == "auto"
                else "--init-adapter none"
            )
            return f"[init] weights: the plain base model {self.model} ({why})"
        info = self.info or {}
        where = f"shipped {Path(self.adapter).name}" if self.shipped else self.adapter
        made = f"LoRA r{info.get('lora_rank')}, {info.get('sft_steps')} SFT steps"
        prov = self.provenance or {}
        held = prov.get("held_out", {}).get("summary")
        when = f" on the prompt texts of commit {prov['commit'][:7]}" if prov.get("commit") else ""
        held = f"; held-out {held}{when}" if held else ""
        return f"[init] weights: {self.model} + warm-start adapter {where} ({made}{held}; merged at load)"

    def record(self) -> dict[str, Any]:
        """What a run's config.json says about its starting weights."""
        return {
            "init_adapter": self.asked,
            "adapter": self.adapter,
            "shipped": self.shipped,
            "adapter_sha256": self.sha256,
            "base_model": self.base_key,
            "env": self.env,
        }


def shipped_adapters() -> list[tuple[Path, dict[str, Any]]]:
    """Every adapter shipped with the package: ``(directory, its sera_adapter.json)``, sorted by name."""
    root = shipped_root()
    found = []
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        if d.is_dir() and (d / RECORD).is_file():
            found.append((d, read_record(d)))
    return found


def resolve_init(asked: str | None, model: str, env: str, seed: int = 0) -> InitWeights:
    """Decide which weights a run on ``model`` / ``env`` starts from (see the module docstring). Raises a
    one-line ``ValueError`` when an explicit adapter was made for another base model or environment, and
    for ``--init-adapter`` with a model the run builds without loading weights from a name."""
    asked = (asked or "auto").strip() or "auto"
    key = model_key(model, seed)
    init = InitWeights(asked=asked, model=model, base_key=key, env=env)
    if asked.lower() == "none":
        init.asked = "none"
        return init
    if asked.lower() == "auto":
        init.asked = "auto"
        for d, rec in shipped_adapters():
            if rec.get("base_model") == key and rec.get("env") == env:
                return _with_adapter(init, d, rec, shipped=True)
        return init
    adapter = Path(asked).expanduser()
    rec = read_record(adapter)
    made_for = (rec.get("base_model"), rec.get("env"))
    if made_for != (key, env):
        raise ValueError(
            f"--init-adapter {asked} was made for model {made_for[0]} on {made_for[1]}, but this run is "
            f"model {key} on {env}; give a matching adapter or --init-adapter none"
        )
    return _with_adapter(init, adapter, rec, shipped=False)


def _with_adapter(init: InitWeights, adapter: Path, rec: dict[str, Any], shipped: bool) -> InitWeights:
    init.adapter, init.shipped, init.info = str(adapter.resolve()), shipped, rec
    init.sha256 = adapter_sha256(adapter)
    if (adapter / PROVENANCE).is_file():
        try:
            init.provenance = json.loads((adapter / PROVENANCE).read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{adapter / PROVENANCE}:{e.lineno}: invalid JSON: {e.msg}") from None
    return init


def merged_model_dir(init: InitWeights, seed: int = 0) -> str:
    """A model directory holding ``init``'s merged weights (float32), for what loads a model by path
    (vLLM, level 2's servers and FSDP ranks): ``$SERA_CACHE/merged/<name>-<hash>``, written once
    (atomically) per base model and adapter. Without an adapter: the model name unchanged."""
    if init.adapter is None:
        return init.model
    from common.policy.models import cache_root, load_model, write_model_dir

    digest = hashlib.sha256(f"{init.base_key}\n{init.sha256}".encode()).hexdigest()[:16]
    target = cache_root() / "merged" / f"{Path(init.adapter).name}-{digest}"
    if (target / "config.json").is_file() and any(target.glob("*.safetensors")):
        return str(target)
    model, tokenizer = load_model(init.model, dtype="float32", seed=seed, adapter=init.adapter)
    extra = {"sera_init.json": json.dumps(init.record(), indent=2)}
    return str(write_model_dir(model, tokenizer, target, extra))
