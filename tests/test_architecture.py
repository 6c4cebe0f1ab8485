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


# ---------------------------------------------------------------- the import graph (issue #52.6)
FLOORS: tuple[tuple[str, ...], ...] = (
    ("common", "common.config", "common.data", "common.templates", "common.memory", "common.stop"),
    ("common.codeact", "common.policy"),
    ("common.envs",),
    ("common.agent",),
    ("common.rl",),
    ("common.train_config",),
    ("common.run",),
    ("common.eval", "common.sft"),
    ("common.train_eval",),
    ("level0_single_process", "level1_batched"),
    ("level2_distributed",),
    ("sera",),
)
"""Floors, lowest first: a module imports only from its own floor or one below it (every import counts, also
one inside a function: a lazy import is still a dependency). ``common`` alone is the package root
(``common/__init__.py``); a ``common`` subpackage or top-level module is one unit."""
PACKAGES = ("common", *TIERS, "sera")


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages."""
    mods = {}
    for top in PACKAGES:
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports (anywhere in the file; ``from pkg import mod`` names
    ``pkg.mod`` when that is a module)."""
    mods = module_files()

    def owner(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for mod, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {owner(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.add(owner(node.module))
                deps |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods}
        graph[mod] = deps - {mod, ""}
    return graph


def unit(mod: str) -> str:
    """The floor unit of a module: ``common.policy.hf`` -> ``common.policy``, ``level1_batched.x`` ->
    ``level1_batched``, ``common`` -> ``common``."""
    parts = mod.split(".")
    return ".".join(parts[:2]) if parts[0] == "common" else parts[0]


def floor_of(mod: str) -> int:
    for i, names in enumerate(FLOORS):
        if unit(mod) in names:
            return i
    raise AssertionError(f"{mod}: its unit {unit(mod)} is on no floor; add it to FLOORS")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_cycle():
    assert cycles(import_graph()) == []


def test_imports_flow_down_the_floors():
    upward = [
        f"{mod} (floor {floor_of(mod)}) imports {dep} (floor {floor_of(dep)})"
        for mod, deps in sorted(import_graph().items())
        for dep in sorted(deps)
        if unit(dep) != unit(mod) and floor_of(dep) > floor_of(mod)
    ]
    assert not upward, "\n".join(upward)


def test_the_graph_checks_can_fail():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert floor_of("common.policy.hf") < floor_of("common.run.progress") < floor_of("common.eval")
    graph = import_graph()
    assert "common.policy.models" in graph["common.policy.warmstart"]  # the parser sees lazy imports
    assert "common.run.progress" in graph["common.eval"]
