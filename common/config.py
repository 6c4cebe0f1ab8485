"""Typed dataclass configs -> CLI options, with each field's docstring as its help text.

Configs in this project are dataclasses whose fields carry a docstring on the line below (the torchtitan
style). A config may *compose* others: a field whose type is itself a dataclass (``TrainConfig.rollout:
RuntimeConfig``) is a group, and its fields become options of the same command. So every value lives in
exactly one field of one dataclass, and the CLI, the tests and the tiers all read it from there.

* :func:`field_docs` reads the docstrings from the source.
* :func:`flat_fields` lists the leaf fields of a (nested) config: ``{option name: (path, field, type)}``.
* :func:`build_config` makes a nested config from flat keyword arguments (``max_steps=3`` goes to
  ``cfg.rollout.max_steps``): one mapping for the CLI and for Python callers.
* :func:`dataclass_command` turns a config class into a typer command; it also reports which options the
  user typed (:class:`Given`), so a profile such as ``--paper`` can fill defaults *before* the user's flags.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any

import typer


def field_docs(cls: type) -> dict[str, str]:
    """``{field name: docstring}`` of a dataclass whose fields are followed by a string literal.

    >>> from common.train_config import OptimConfig
    >>> field_docs(OptimConfig)["lr"]
    'AdamW learning rate (constant).'
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
    """``str | None`` -> ``str`` (typer needs a concrete type; None stays the default). Literals stay."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    return tp


def option_type(cls: type, name: str) -> Any:
    """The CLI type of field ``name`` of dataclass ``cls`` (``bool | None`` -> ``bool``; None stays the default).

    >>> from level1_batched.config import Level1Config
    >>> option_type(Level1Config, "fast_trainer"), option_type(Level1Config, "engine")
    (<class 'bool'>, <class 'str'>)
    """
    return _cli_type(typing.get_type_hints(cls)[name])


def _default(f: dataclasses.Field) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


def flat_fields(
    cls: type, groups: dict[str, Iterable[str]] | None = None, _prefix: tuple[str, ...] = ()
) -> dict[str, tuple[tuple[str, ...], Any, Any, str]]:
    """``{name: (path, default, type, help)}`` for every leaf field of a config, nested groups flattened.

    ``groups`` limits which fields of a nested dataclass are options (``{"rollout": ("max_steps", ...)}``);
    a nested group not named there contributes all its fields. Default: the class attribute
    ``OPTION_GROUPS``, if it has one. Names must be unique across groups.

    >>> from common.train_config import TrainConfig
    >>> fields = flat_fields(TrainConfig)
    >>> {name: fields[name][0] for name in ("steps", "max_steps", "lr")}
    {'steps': ('steps',), 'max_steps': ('rollout', 'max_steps'), 'lr': ('optim', 'lr')}
    """
    docs, hints, out = field_docs(cls), typing.get_type_hints(cls), {}
    groups = groups if groups is not None else getattr(cls, "OPTION_GROUPS", None)

    def add(name: str, entry: tuple) -> None:
        if name in out:
            raise TypeError(f"option name {name!r} appears twice in {cls.__name__}")
        out[name] = entry

    for f in dataclasses.fields(cls):
        tp, default = hints[f.name], _default(f)
        if dataclasses.is_dataclass(tp):
            allowed = set((groups or {}).get(f.name, [g.name for g in dataclasses.fields(tp)]))
            inner_docs, inner_hints = field_docs(tp), typing.get_type_hints(tp)
            for g in dataclasses.fields(tp):
                if g.name in allowed:
                    entry = ((*_prefix, f.name, g.name), getattr(default, g.name), inner_hints[g.name])
                    add(g.name, (*entry, inner_docs.get(g.name, "")))
            continue
        add(f.name, ((*_prefix, f.name), default, tp, docs.get(f.name, "")))
    return out


def build_config(cls: type, base: Any = None, **flat: Any) -> Any:
    """A (nested) config from flat keyword arguments, on top of ``base`` (default: the class defaults).

    Unknown names raise ``TypeError`` (a typo never silently does nothing).

    >>> from common.train_config import TrainConfig
    >>> cfg = build_config(TrainConfig, steps=5, max_steps=8)
    >>> cfg.steps, cfg.rollout.max_steps
    (5, 8)
    """
    fields = flat_fields(cls)
    unknown = sorted(set(flat) - set(fields))
    if unknown:
        raise TypeError(f"{cls.__name__} has no setting(s) {', '.join(unknown)}")
    nested: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for name, value in flat.items():
        path = fields[name][0]
        if len(path) == 1:
            top[name] = value
        else:
            nested.setdefault(path[0], {})[path[1]] = value
    defaults = {f.name: f for f in dataclasses.fields(cls)}
    problems = []  # every group's out-of-range values in one message, not only the first group's
    for group, values in nested.items():
        inner = getattr(base, group) if base is not None else _default(defaults[group])
        try:
            top[group] = dataclasses.replace(inner, **values)
        except ValueError as e:
            problems.append(str(e))
            top[group] = inner  # so the outer config's own checks still run
    try:
        built = dataclasses.replace(base, **top) if base is not None else cls(**top)
    except ValueError as e:
        problems.append(str(e))
    if problems:
        raise ValueError("; ".join(problems))
    return built


def check_ranges(
    minimums: Iterable[tuple[str, float, float]] = (),
    units: Iterable[tuple[str, float]] = (),
    positives: Iterable[tuple[str, float]] = (),
    fractions: Iterable[tuple[str, float]] = (),
) -> None:
    """Raise one ``ValueError`` naming every option out of range, as the CLI spells it (NaN is never in range).

    ``minimums`` = ``(field, value, lowest allowed)``; ``units`` = ``(field, value)`` that must lie in [0, 1];
    ``positives``: must be > 0; ``fractions``: must lie in [0, 1) (AdamW's betas).

    >>> check_ranges([("steps", 0, 1), ("warmup", 0, 0)], [("oracle_mix", 1.5)])
    Traceback (most recent call last):
    ValueError: --steps must be >= 1 (got 0); --oracle-mix must be in [0, 1] (got 1.5)
    >>> check_ranges(positives=[("lr", 0.0)], fractions=[("beta1", 1.0)])
    Traceback (most recent call last):
    ValueError: --lr must be > 0 (got 0.0); --beta1 must be in [0, 1) (got 1.0)
    """

    def opt(k: str) -> str:
        return "--" + k.replace("_", "-")

    problems = [f"{opt(k)} must be >= {lo} (got {v})" for k, v, lo in minimums if not v >= lo]
    problems += [f"{opt(k)} must be in [0, 1] (got {v})" for k, v in units if not 0.0 <= v <= 1.0]
    problems += [f"{opt(k)} must be > 0 (got {v})" for k, v in positives if not v > 0]
    problems += [f"{opt(k)} must be in [0, 1) (got {v})" for k, v in fractions if not 0.0 <= v < 1.0]
    if problems:
        raise ValueError("; ".join(problems))


def literal_choices(tp: Any) -> tuple[Any, ...] | None:
    """The allowed values of a ``Literal[...]`` type (``Literal[...] | None`` too), else None."""
    if typing.get_origin(tp) is typing.Literal:
        return typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if typing.get_origin(arg) is typing.Literal:
                return typing.get_args(arg)
    return None


def check_choices(cfg: Any) -> None:
    """Raise one ``ValueError`` naming every enumerated (``Literal``) field of dataclass ``cfg`` whose value is
    not one of its choices (None passes where the type allows it).

    >>> from common.train_config import OptimConfig
    >>> OptimConfig(dtype="fp8")
    Traceback (most recent call last):
    ValueError: --dtype must be one of auto, float32, bfloat16 (got 'fp8')
    """
    hints = typing.get_type_hints(type(cfg))
    problems = []
    for f in dataclasses.fields(cfg):
        choices = literal_choices(hints[f.name])
        value = getattr(cfg, f.name)
        if choices is None or value in choices or (value is None and _allows_none(hints[f.name])):
            continue
        problems.append(
            f"--{f.name.replace('_', '-')} must be one of {', '.join(map(str, choices))} (got {value!r})"
        )
    if problems:
        raise ValueError("; ".join(problems))


def _allows_none(tp: Any) -> bool:
    return type(None) in typing.get_args(tp)


def flatten(cfg: Any) -> dict[str, Any]:
    """The inverse of :func:`build_config`: ``{option name: value}`` of every leaf field."""
    return {name: _get(cfg, path) for name, (path, *_rest) in flat_fields(type(cfg)).items()}


def _get(cfg: Any, path: tuple[str, ...]) -> Any:
    for p in path:
        cfg = getattr(cfg, p)
    return cfg


class Given(set):
    """The option names the user typed on the command line (not defaults)."""


def short_help(doc: str) -> str:
    """An option's ``--help`` text: the first sentence of its docstring (the whole docstring is the field's
    documentation in its config class).

    >>> short_help("Optimizer steps to reach (the policy version; paper: 250). A second sentence.")
    'Optimizer steps to reach (the policy version; paper: 250).'
    >>> short_help("Tasks, e.g. 8 of them. More.")
    'Tasks, e.g. 8 of them.'
    """
    text = " ".join(doc.split())
    depth, cut = 0, len(text)
    for i, ch in enumerate(text):
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "." and depth == 0 and (i + 1 == len(text) or text[i + 1] == " "):
            word = text[: i + 1].rsplit(" ", 1)[-1].lower()
            if word in ("e.g.", "i.e.", "vs.", "etc.") or i + 2 < len(text) and not text[i + 2].isupper():
                continue
            cut = i + 1
            break
    return text[:cut]


CHOICES_IN_COLUMN = 12
"""A choice list longer than this goes at the start of the help text, not the narrow type column."""


def option_decls(name: str, default: Any) -> list[str]:
    """The option names of a field: ``--name`` alone for a flag that is off by default (``--no-name`` would
    only repeat the default and widen every help table), ``--name/--no-name`` otherwise (typer's own)."""
    return [f"--{name.replace('_', '-')}"] if default is False else []


def dataclass_command(
    cls: type,
    run: Callable[..., None],
    extra: list[inspect.Parameter] | None = None,
    exclude: tuple[str, ...] = (),
    groups: dict[str, Iterable[str]] | None = None,
    panels: dict[str, str] | None = None,
) -> Callable[..., None]:
    """A function typer can register: one ``--option`` per (leaf) config field, help = its docstring.

    ``run(cfg, given=Given(...), **extra)`` receives the built config, the names the user typed, and the
    ``extra`` parameters. ``panels`` puts options under a named help panel (``{name: panel}``).
    """
    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
    names = []
    for name, (_path, default, tp, doc) in flat_fields(cls, groups).items():
        if name in exclude:
            continue
        panel = (panels or {}).get(name)
        choices = literal_choices(tp)  # typed as str: the config checks it (one line, exit 2)
        metavar = None if choices is None else "[" + "|".join(map(str, choices)) + "]"
        text = short_help(doc)
        if metavar is not None and len(metavar) > CHOICES_IN_COLUMN:  # a wide type column squeezes the help
            metavar, text = "CHOICE", f"{'|'.join(map(str, choices))}: {text}"  # no [...]: rich markup
        params.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=str if choices is not None else _cli_type(tp),
                default=typer.Option(
                    default, *option_decls(name, default), help=text, rich_help_panel=panel, metavar=metavar
                ),
            )
        )
        names.append(name)
    params += list(extra or [])  # after the config's own options in --help
    extra_names = [p.name for p in extra or []]

    def command(ctx: typer.Context, **kwargs: Any) -> None:
        given = Given(
            k
            for k in [*names, *extra_names]
            if getattr(ctx.get_parameter_source(k), "name", "") == "COMMANDLINE"
        )
        cfg = build_config(cls, **{k: kwargs[k] for k in names})
        run(cfg, given=given, **{k: kwargs[k] for k in extra_names})

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__doc__ = (cls.__doc__ or "").strip()
    return command
