"""Policy backends and ``make_policy(spec, **kw)``, the one way the CLI and the levels build a policy.

Specs:

* ``oracle`` (needs ``env=`` 'textcraft' | 'textworld' | 'textworld-cooking', or ``oracle:ENV``): the
  environment's scripted oracle (``common.envs.*.oracle.oracle_reply``, imported lazily); extra keyword
  arguments (e.g. ``delegate=True``) are passed to the oracle's reply function (those it does not
  accept are dropped with a warning);
* ``random``: seeded random valid actions (``seed=``);
* ``replay:FILE.json``: replies replayed from a JSON list or an object of per-role lists;
* ``hf:MODEL``: a local transformers model (MODEL = ``smollm2``, ``tiny``, a path or an HF id); keyword
  arguments go to ``HFPolicy`` (``dtype``, ``device``, ``max_batch_size``, ``max_wait_ms``, ...);
* ``openai:URL#MODEL``: an OpenAI-compatible server (``#MODEL`` optional: the first served model);
  keyword arguments go to ``OpenAIPolicy``;
* ``vllm:MODEL`` (or any kind a tier registers with :func:`register_engine`): an engine that lives in a
  tier, e.g. level 1's in-process vLLM (importing ``level1_batched`` registers ``vllm``; ``common/``
  never imports vLLM or a tier itself).

Only the base types are imported eagerly, so scripted policies never import torch.
Example: ``make_policy("hf:tiny", dtype="float32")``, ``make_policy("oracle", env="textcraft")``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import warnings
from collections.abc import Callable
from typing import Any

from common.policy.base import Completion, GenerationRequest, Policy, Role, SamplingParams

ORACLE_MODULES = {
    "textcraft": "common.envs.textcraft.oracle",
    "textworld": "common.envs.textworld_sync.oracle",
    "textworld-sync": "common.envs.textworld_sync.oracle",
    "textworld_sync": "common.envs.textworld_sync.oracle",
    "textworld-cooking": "common.envs.textworld_cooking.oracle",
    "textworld_cooking": "common.envs.textworld_cooking.oracle",
}

SPEC_HELP = (
    "policy specs: 'oracle' (with env=textcraft|textworld|textworld-cooking, or 'oracle:ENV'), 'oracle-delegate', 'random', "
    "'replay:FILE.json', 'hf:MODEL' (smollm2 | tiny | path | HF id), 'openai:URL#MODEL', 'vllm:MODEL' (level 1)"
)

ENGINE_FACTORIES: dict[str, Callable[..., Policy]] = {}
"""Policy kinds provided by tiers: ``kind -> factory(arg, **kw)`` (filled by :func:`register_engine`)."""

TIER_ENGINES = {"vllm": "level1_batched (vllm_engine.py)"}
"""Where the known tier engines live (for the error message only: common/ never imports a tier)."""


def register_engine(kind: str, factory: Callable[..., Policy]) -> None:
    """Make ``make_policy("KIND:ARG", **kw)`` call ``factory(ARG, **kw)`` (a tier registers its engines)."""
    ENGINE_FACTORIES[kind.lower()] = factory


def oracle_reply_fn(env: str, **kw: Any) -> Any:
    """The oracle reply function of ``env`` (``kw`` bound into it, e.g. ``delegate=True``)."""
    mod_name = ORACLE_MODULES.get(env)
    if mod_name is None:
        raise ValueError(f"no oracle for env {env!r}; known: {sorted(ORACLE_MODULES)}")
    fn = importlib.import_module(mod_name).oracle_reply
    params = inspect.signature(fn).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = sorted(k for k in kw if k not in params)
        if unknown:
            warnings.warn(f"the {env} oracle ignores {unknown}", stacklevel=2)
        kw = {k: v for k, v in kw.items() if k in params}
    return functools.partial(fn, **kw) if kw else fn


def make_policy(spec: str, **kw: Any) -> Policy:
    """Build a policy from a spec string (see the module docstring); ``ValueError`` for bad specs."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"empty policy spec; {SPEC_HELP}")
    spec = spec.strip()
    kind, sep, arg = spec.partition(":")
    kind = kind.lower()
    if kind in ("oracle", "oracle-delegate"):  # oracle-delegate: the oracle that delegates subgoals
        from common.policy.scripted import OraclePolicy

        if kind == "oracle-delegate":
            kw.setdefault("delegate", True)
        env = kw.pop("env", None) or (arg if sep else None)
        if not env:
            raise ValueError(f"'oracle' needs the environment: make_policy('oracle', env=...); {SPEC_HELP}")
        return OraclePolicy(oracle_reply_fn(str(env).lower(), **kw))
    if kind == "random":
        from common.policy.scripted import RandomPolicy

        kw.pop("env", None)
        if sep and arg:
            if not arg.lstrip("-").isdigit():
                raise ValueError(f"'random:SEED' needs an integer seed, got {arg!r}; {SPEC_HELP}")
            kw.setdefault("seed", int(arg))
        return RandomPolicy(**kw)
    if kind == "replay":
        from common.policy.scripted import ReplayPolicy

        if not arg:
            raise ValueError(f"'replay' needs a file: 'replay:FILE.json'; {SPEC_HELP}")
        return ReplayPolicy(arg)
    if kind == "hf":
        if not arg:
            raise ValueError(f"'hf' needs a model: 'hf:smollm2', 'hf:tiny' or 'hf:PATH'; {SPEC_HELP}")
        from common.policy.hf import HFPolicy

        kw.pop("env", None)
        return HFPolicy(arg, **kw)
    if kind == "openai":
        url, _, model = arg.partition("#")
        if not url:
            raise ValueError(f"'openai' needs a URL: 'openai:http://127.0.0.1:8000#MODEL'; {SPEC_HELP}")
        from common.policy.openai import OpenAIPolicy

        kw.pop("env", None)
        return OpenAIPolicy(url, model or None, **kw)
    if kind in ENGINE_FACTORIES:
        if not arg:
            raise ValueError(f"'{kind}' needs a model: '{kind}:smollm2' or '{kind}:PATH'; {SPEC_HELP}")
        kw.pop("env", None)
        return ENGINE_FACTORIES[kind](arg, **kw)
    if kind in TIER_ENGINES:
        raise ValueError(
            f"policy kind {kind!r} is provided by {TIER_ENGINES[kind]}: import its tier first (the sera CLI "
            f"does), or use 'hf:MODEL'"
        )
    raise ValueError(f"unknown policy spec {spec!r}; {SPEC_HELP}")


__all__ = [
    "Completion",
    "GenerationRequest",
    "Policy",
    "Role",
    "SamplingParams",
    "make_policy",
    "oracle_reply_fn",
    "register_engine",
]
