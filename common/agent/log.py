"""The offline rollout log: one JSON line per root rollout (a whole :class:`~common.agent.tree.Tree`).

Writers call :func:`append_tree`; it goes through :func:`common.data.append_jsonl`, which writes the
whole line with a single ``write`` and then fsyncs, so a process killed mid-write leaves either the full
line or a final fragment without a newline. Readers (:func:`read_trees`, :func:`iter_trees`) skip such
a torn final line with a warning, and raise :class:`TreeLogError` (``path:line: reason``) for any
malformed line elsewhere: a broken middle line means the file was damaged, not merely interrupted.

A single-JSON file is read too: one result of ``sera eval`` (``DIR/results/NNNNN.json``, whose
``tree`` field holds the tree) or one tree object, so ``sera view`` opens either.

Simplifications: no rotation, compression or index; a reader loads each line fully. Validation is
``Tree.from_dict`` (schema version, field names) plus a few structural checks (root present, parents
exist, node ids match their keys).

Usage::

    append_tree("runs/x/trees.jsonl", tree)
    trees = read_trees("runs/x/trees.jsonl")
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from common.agent.tree import Tree
from common.data import append_jsonl

logger = logging.getLogger(__name__)


class TreeLogError(ValueError):
    """A tree log line could not be read; the message names the file and the 1-based line."""

    def __init__(self, path: str | os.PathLike, line: int, reason: str):
        self.path, self.line, self.reason = str(path), line, reason
        super().__init__(f"{path}:{line}: {reason}")


def append_tree(path: str | os.PathLike, tree: Tree) -> None:
    """Append one tree as one JSON line (single write + fsync; safe against a kill mid-write)."""
    append_jsonl(path, tree.to_dict())


def validate_tree(tree: Tree) -> None:
    """Structural checks beyond the schema. Raises ValueError naming the first problem."""
    if tree.root_id not in tree.nodes:
        raise ValueError(f"root_id {tree.root_id!r} is not among the nodes")
    for key, node in tree.nodes.items():
        if node.node_id != key:
            raise ValueError(f"node stored under {key!r} has node_id {node.node_id!r}")
        if node.parent_id is not None and node.parent_id not in tree.nodes:
            raise ValueError(f"node {key!r} has unknown parent {node.parent_id!r}")
    if tree.root.parent_id is not None:
        raise ValueError(f"root {tree.root_id!r} has a parent {tree.root.parent_id!r}")


def _parse_line(path: Path, lineno: int, line: str) -> Tree:
    try:
        d = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise TreeLogError(path, lineno, f"invalid JSON: {e}") from None
    if not isinstance(d, dict):
        raise TreeLogError(path, lineno, f"expected a JSON object, got {type(d).__name__}")
    try:
        tree = Tree.from_dict(d)
        validate_tree(tree)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise TreeLogError(path, lineno, f"invalid tree: {type(e).__name__}: {e}") from None
    return tree


def _single_json_trees(path: Path) -> list[Tree] | None:
    """The tree(s) of a file holding ONE JSON document (an eval result or a bare tree); None when the
    file is not one JSON document (then it is read as a JSONL log)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(doc, dict) and "index" in doc and "task_id" in doc:  # one `sera eval` result
        if not doc.get("tree"):
            why = f" (the task errored: {doc['error']})" if doc.get("error") else ""
            raise TreeLogError(path, 1, f"this eval result holds no tree{why}")
        doc = doc["tree"]
    if not isinstance(doc, dict) or "nodes" not in doc:
        raise TreeLogError(path, 1, "one JSON document that is neither a tree nor a `sera eval` result")
    return [_parse_line(path, 1, json.dumps(doc))]


def iter_trees(path: str | os.PathLike) -> Iterator[Tree]:
    """Yield the trees of a log in order (see the module docstring for the torn-line rule)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"tree log not found: {path}")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; give a trees.jsonl file (or an eval directory)")
    if path.suffix == ".json":
        single = _single_json_trees(path)
        if single is not None:
            yield from single
            return
    with open(path, "rb") as f:
        lineno = 0
        for raw in f:
            lineno += 1
            if not raw.endswith(b"\n"):
                # Only the last line of a file can lack its newline: a write interrupted by a kill.
                logger.warning(
                    "%s:%d: skipping a torn final line (%d bytes, no newline; the writer was interrupted)",
                    path,
                    lineno,
                    len(raw),
                )
                return
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise TreeLogError(path, lineno, f"not UTF-8: {e}") from None
            if not line.strip():
                continue
            yield _parse_line(path, lineno, line)


def read_trees(path: str | os.PathLike) -> list[Tree]:
    """All trees of a log. Raises TreeLogError (``path:line: reason``) for a malformed line."""
    return list(iter_trees(path))
