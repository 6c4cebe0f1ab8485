"""Architecture rules that keep the tiers honest (issue #9):

* nothing under ``common/`` imports a tier, torch.distributed, Ray or an inference-server package;
* no tier imports another tier's ``train.py`` (only tests and the CLI do);
* no tier imports the CLI (``sera``): imports flow cli -> tiers -> common; a tier's own entry point runs
  the ``sera`` command as a program (``common/run/entry.py``), issue #24;
* every runnable file opens with a docstring.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIERS = ("level0_single_process", "level1_batched", "level2_distributed")
FORBIDDEN_IN_COMMON = ("torch.distributed", "ray", "sglang", "vllm", "sera", *TIERS)


def imports_of(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _forbidden(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize(
    "path", sorted((ROOT / "common").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_common_imports_no_tier_and_no_distributed_stack(path: Path):
    bad = [n for n in imports_of(path) if _forbidden(n, FORBIDDEN_IN_COMMON)]
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_the_guard_can_fail():
    assert _forbidden("torch.distributed.checkpoint", FORBIDDEN_IN_COMMON)
    assert _forbidden("level1_batched.train", FORBIDDEN_IN_COMMON)
    assert not _forbidden("torch.nn", FORBIDDEN_IN_COMMON) and not _forbidden("rayon", FORBIDDEN_IN_COMMON)


@pytest.mark.parametrize("tier", TIERS)
def test_no_tier_imports_a_train_script(tier: str):
    for path in (ROOT / tier).rglob("*.py"):
        bad = [n for n in imports_of(path) if n.split(".")[0] in TIERS and n.split(".")[-1] == "train"]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


@pytest.mark.parametrize("tier", TIERS)
def test_no_tier_imports_the_cli(tier: str):
    for path in (ROOT / tier).rglob("*.py"):
        bad = [n for n in imports_of(path) if _forbidden(n, ("sera",))]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_runnable_files_open_with_a_docstring():
    files = [*(ROOT / "common").rglob("*.py"), *(ROOT / "sera").glob("*.py"), *(ROOT / "bench").glob("*.py")]
    for tier in TIERS:
        files += list((ROOT / tier).rglob("*.py"))
    missing = [
        str(p.relative_to(ROOT))
        for p in files
        if p.stat().st_size and ast.get_docstring(ast.parse(p.read_text())) is None
    ]
    assert not missing, f"no module docstring: {missing}"
