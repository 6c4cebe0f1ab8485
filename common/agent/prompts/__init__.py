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

PACKAGED_DIR = Path(__file__).resolve().parent
"""Where the packaged templates live (shipped as package data: ``*.txt``)."""


class PromptTemplateError(ValueError):
    """A user template is unreadable or uses a placeholder the code does not provide."""


def _read(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptTemplateError(f"{path}: cannot read prompt template ({exc})") from None
    return text[:-1] if text.endswith("\n") else text


def _check(path: Path, text: str, allowed: frozenset[str]) -> None:
    """Every ``$placeholder`` of ``text`` is one of ``allowed``; errors name ``file:line``."""
    for lineno, line in enumerate(text.split("\n"), start=1):
        tmpl = Template(line)
        if not tmpl.is_valid():
            raise PromptTemplateError(
                f"{path}:{lineno}: malformed placeholder (write $$ for a literal dollar sign)"
            )
        for name in tmpl.get_identifiers():
            if name not in allowed:
                raise PromptTemplateError(
                    f"{path}:{lineno}: unknown placeholder ${name}; this template may use "
                    + (", ".join(f"${a}" for a in sorted(allowed)) or "no placeholders")
                )


@functools.lru_cache(maxsize=32)
def _load(spec: tuple[tuple[str, frozenset[str]], ...], prompts_dir: str | None) -> dict[str, str]:
    user_dir = Path(prompts_dir).expanduser() if prompts_dir else None
    if user_dir is not None and not user_dir.is_dir():
        raise PromptTemplateError(f"{user_dir}: prompts directory does not exist")
    out: dict[str, str] = {}
    for name, allowed in spec:
        path = PACKAGED_DIR / f"{name}.txt"
        if user_dir is not None and (user_dir / f"{name}.txt").is_file():
            path = user_dir / f"{name}.txt"
        text = _read(path)
        _check(path, text, allowed)
        out[name] = text
    return out


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
