"""Typed dataclass configs -> CLI options, with each field's docstring as its help text.

Configs in this project are dataclasses whose fields carry a docstring on the line below (the torchtitan
style). :func:`field_docs` reads those docstrings from the source, and :func:`dataclass_command` turns a
dataclass into a typer command whose options are the fields (``--max-new-tokens 96``), so a value lives
in exactly one place: the dataclass.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from collections.abc import Callable
from typing import Any

import typer


def field_docs(cls: type) -> dict[str, str]:
    """``{field name: docstring}`` of a dataclass whose fields are followed by a string literal.

    >>> @dataclasses.dataclass
    ... class C:
    ...     lr: float = 1e-3
    ...     '''Learning rate.'''
    >>> field_docs(C)
    {'lr': 'Learning rate.'}
    """
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, nxt in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _cli_type(tp: Any) -> Any:
    """``str | None`` -> ``str`` (typer needs a concrete type; None stays the default)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    return tp


def dataclass_command(
    cls: type,
    run: Callable[[Any], None],
    extra: list[inspect.Parameter] | None = None,
    exclude: tuple[str, ...] = (),
) -> Callable[..., None]:
    """A function typer can register: one ``--option`` per dataclass field (help = the field docstring).
    ``extra`` parameters are passed to ``run`` as keyword arguments next to the built config."""
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    params = list(extra or [])
    names = []
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        params.append(
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=_cli_type(hints[f.name]),
                default=typer.Option(default, help=docs.get(f.name, "")),
            )
        )
        names.append(f.name)
    extra_names = [p.name for p in extra or []]

    def command(**kwargs: Any) -> None:
        cfg = cls(**{k: kwargs[k] for k in names})
        run(cfg, **{k: kwargs[k] for k in extra_names})

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__doc__ = (cls.__doc__ or "").strip()
    return command
