"""Prompt template files: read, check and pick (packaged or the user's ``--prompts-dir``), for every loader.

Three loaders use these rules: the rubric writer's and scorer's texts (``common/agent/prompts``),
TextCraft's (``common/envs/textcraft/prompts.py``) and TextWorld-Sync's
(``common/envs/textworld_sync/prompts.py``). Each keeps its own names and the placeholders each template
may use; the file rules are here once:

* Python's ``string.Template``: ``$name`` / ``${name}`` is a placeholder, ``$$`` a literal dollar sign;
* the file's single final newline (the one editors add) is dropped;
* a placeholder the template may not use, or a ``$`` that starts none, is an error naming ``file:line``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from string import Template


class PromptTemplateError(ValueError):
    """A template file is unreadable, names a placeholder it may not use, or has a stray ``$``."""


def read_template(path: Path) -> str:
    """The file's text without its final newline; unreadable files raise :class:`PromptTemplateError`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptTemplateError(f"{path}: cannot read prompt template ({exc})") from None
    return text[:-1] if text.endswith("\n") else text


def check_placeholders(path: Path, text: str, allowed: Iterable[str]) -> None:
    """Every placeholder of ``text`` is one of ``allowed``; errors name ``file:line``.

    >>> check_placeholders(Path("t.txt"), "a $x\\ncosts $$5 and $y", {"x"})
    Traceback (most recent call last):
    common.templates.PromptTemplateError: t.txt:2: unknown placeholder $y; this template may use $x
    >>> check_placeholders(Path("t.txt"), "cost $5", {"x"})
    Traceback (most recent call last):
    common.templates.PromptTemplateError: t.txt:1: a '$' that starts no placeholder (write $$ for a literal '$')
    """
    allowed = frozenset(allowed)
    for lineno, line in enumerate(text.split("\n"), start=1):
        tmpl = Template(line)
        if not tmpl.is_valid():
            raise PromptTemplateError(
                f"{path}:{lineno}: a '$' that starts no placeholder (write $$ for a literal '$')"
            )
        for name in tmpl.get_identifiers():
            if name not in allowed:
                names = ", ".join(f"${a}" for a in sorted(allowed)) or "no placeholders"
                raise PromptTemplateError(
                    f"{path}:{lineno}: unknown placeholder ${name}; this template may use {names}"
                )


def load_template(path: Path, allowed: Iterable[str]) -> str:
    """:func:`read_template` then :func:`check_placeholders`."""
    text = read_template(path)
    check_placeholders(path, text, allowed)
    return text


def user_dir(prompts_dir: str | Path | None) -> Path | None:
    """``prompts_dir`` as a directory that exists (or None); a missing one is a clear error."""
    if prompts_dir is None:
        return None
    d = Path(prompts_dir).expanduser()
    if not d.is_dir():
        raise PromptTemplateError(f"{d}: prompts directory does not exist")
    return d


def pick(filename: str, packaged: Path, user: Path | None) -> Path:
    """The user's ``filename`` where the user's directory holds it, else the packaged one."""
    if user is not None and (user / filename).is_file():
        return user / filename
    return packaged / filename
