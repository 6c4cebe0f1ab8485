"""The rubric writer's and the scorer's prompt templates, and the one loader that reads them.

Every text the policy sees when it writes or applies a rubric lives in a ``.txt`` file beside this module
(``rubric_system.txt``, ``rubric_user.txt``, ``rubric_context.txt``, ``rubric_parent_message.txt``,
``rubric_truncation.txt``, ``score_system.txt``, ``score_user.txt``). Their structure follows the public
SERA code (``Runtime/rubric/prompts.py``: the same section tags, JSON keys and payload); the wording is
this project's own.

``load_templates(spec, prompts_dir)`` returns the texts. A file of the same name in ``prompts_dir`` (the
``--prompts DIR`` option) replaces the packaged one, so someone holding the original texts can reproduce
the paper's prompts exactly; files the directory lacks fall back to the packaged ones.

Template rules (Python's ``string.Template``): ``$name`` or ``${name}`` is a placeholder, ``$$`` a literal
dollar sign, and every other character is kept as written; the file's single final newline (the one
editors add) is dropped. A placeholder the code does not provide is an error naming ``file:line``.

Simplification: templates are plain text, not Jinja; there are no conditionals (optional parts are
built in code and passed as a placeholder value).
"""

from __future__ import annotations

import functools
from pathlib import Path
from string import Template

from common.templates import PromptTemplateError, load_template, pick, user_dir

__all__ = ["PACKAGED_DIR", "PromptTemplateError", "load_templates", "render"]

PACKAGED_DIR = Path(__file__).resolve().parent
"""Where the packaged templates live (shipped as package data: ``*.txt``)."""


@functools.lru_cache(maxsize=32)
def _load(spec: tuple[tuple[str, frozenset[str]], ...], prompts_dir: str | None) -> dict[str, str]:
    user = user_dir(prompts_dir)
    return {name: load_template(pick(f"{name}.txt", PACKAGED_DIR, user), allowed) for name, allowed in spec}


def load_templates(spec: dict[str, frozenset[str]], prompts_dir: str | Path | None = None) -> dict[str, str]:
    """``{name: template text}`` for every ``name`` of ``spec`` (values: the placeholders it may use).

    Cached per ``(spec, prompts_dir)``; edit a file and start a new process to see the change.
    """
    key = tuple(sorted(spec.items()))
    return dict(_load(key, str(prompts_dir) if prompts_dir else None))


def render(template: str, **values: object) -> str:
    """Fill ``template``'s placeholders (all of ``values`` need not be used; unknown ones were rejected
    when the template was loaded)."""
    return Template(template).safe_substitute({k: str(v) for k, v in values.items()})
