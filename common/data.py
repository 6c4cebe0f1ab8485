"""JSONL task files: read with file:line errors, write atomically.

Every task loader in the project goes through :func:`read_jsonl`, so a malformed record is always
reported as ``path:line: reason`` and never silently skipped.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """``$SERA_CACHE`` or ``~/.cache/sera``: the converted model, merged warm starts, the paper's task splits."""
    return Path(os.environ.get("SERA_CACHE") or Path.home() / ".cache" / "sera")


class TaskFileError(ValueError):
    """A task file could not be read; the message names the file and the line."""

    def __init__(self, path: str | os.PathLike, line: int, reason: str):
        self.path, self.line, self.reason = str(path), line, reason
        super().__init__(f"{path}:{line}: {reason}")


def read_jsonl(
    path: str | os.PathLike, validate: Callable[[dict[str, Any]], None] | None = None
) -> list[dict[str, Any]]:
    """Read a JSONL file of objects. ``validate(record)`` may raise ValueError/KeyError/TypeError;
    any failure is re-raised as :class:`TaskFileError` with the 1-based line number. Blank lines are
    skipped. A file holding one JSON array or a manifest object ``{"tasks": [...]}`` is accepted too
    (errors then name the element index as the line)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"task file not found: {path}")
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    records: list[tuple[int, Any]] = []
    if stripped.startswith("[") or (stripped.startswith("{") and _is_single_json(stripped)):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise TaskFileError(path, e.lineno, f"invalid JSON: {e.msg}") from None
        if isinstance(doc, dict):
            items = next(
                (doc[k] for k in ("tasks", "rows", "data", "examples") if isinstance(doc.get(k), list)), None
            )
            if items is None:
                items = [doc]
        else:
            items = doc
        records = [(i + 1, r) for i, r in enumerate(items)]
    else:
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append((lineno, json.loads(line)))
            except json.JSONDecodeError as e:
                raise TaskFileError(path, lineno, f"invalid JSON: {e.msg} (column {e.colno})") from None
    out = []
    for lineno, rec in records:
        if not isinstance(rec, dict):
            raise TaskFileError(path, lineno, f"expected a JSON object, got {type(rec).__name__}")
        if validate is not None:
            try:
                validate(rec)
            except (ValueError, KeyError, TypeError) as e:
                raise TaskFileError(path, lineno, f"invalid record: {e}") from None
        out.append(rec)
    return out


def _is_single_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def file_mode() -> int:
    """The mode a plain ``open(path, "w")`` would give a new file: 0o666 minus the umask (0o644 under the
    usual umask 022). ``tempfile.mkstemp`` creates 0o600 files, so atomic writers chmod to this."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_jsonl(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> int:
    """Write records atomically (temp file + rename, mode as for a plain write); returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, sort_keys=False) + "\n")
                n += 1
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return n


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file beside it + rename, fsynced (a reader sees the old file, none,
    or the whole new one; never a torn one), with the mode a plain write would give; no temp file is left."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def append_jsonl(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append one record as a single ``write`` of one full line, then fsync: a killed process leaves
    either the whole line or none of it (readers drop a final line without a newline)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(record) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)  # minus the umask, as open() does
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
