"""What the trees of an evaluation cost: success, agents and generated tokens per tree, by call role.

    python bench/tree_stats.py runs/eval_a runs/eval_b          # `sera eval` output directories
    python bench/tree_stats.py runs/level0/trees.jsonl          # a training run's trees

Used to predict a CPU quick-start round from a cheap GPU evaluation of the same policy on the quick start's
task pool (issue #23.4): a round's seconds follow the tokens its trees generate. Prints one markdown row per
input. Reads only what the files hold (every model call of a tree keeps its ``output_ids``).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def trees_of(path: Path) -> Iterator[dict[str, Any]]:
    """The trees of an eval directory (results/*.json) or of a JSONL file of trees."""
    if path.is_dir():
        for f in sorted((path / "results").glob("*.json")):
            row = json.loads(f.read_text())
            yield {**row["tree"], "success": row["success"]}
    else:
        for line in path.read_text().splitlines():
            if line.strip():
                yield json.loads(line)


def calls_of(x: Any) -> Iterator[dict[str, Any]]:
    """Every model call inside a tree (a dict that holds ``output_ids``), wherever the schema keeps it."""
    if isinstance(x, dict):
        if "output_ids" in x and "role" in x:
            yield x
        for v in x.values():
            yield from calls_of(v)
    elif isinstance(x, list):
        for v in x:
            yield from calls_of(v)


def summarize(path: Path) -> dict[str, Any]:
    trees = list(trees_of(path))
    if not trees:
        raise SystemExit(f"{path}: no trees found")
    tokens, agents, by_role, wins = [], [], Counter(), 0
    for t in trees:
        calls = list(calls_of(t))
        for c in calls:
            by_role[c["role"]] += len(c["output_ids"])
        tokens.append(sum(len(c["output_ids"]) for c in calls))
        agents.append(len(t.get("nodes", {})))
        wins += bool(t.get("success"))
    return {
        "input": str(path),
        "trees": len(trees),
        "success": wins / len(trees),
        "agents_mean": statistics.mean(agents),
        "tokens_mean": statistics.mean(tokens),
        "tokens_max": max(tokens),
        "by_role": {k: round(v / len(trees)) for k, v in sorted(by_role.items())},
    }


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    print(
        "| input | trees | success | agents / tree | generated tokens / tree (mean, max) | per role / tree |"
    )
    print("|---|---|---|---|---|---|")
    for a in argv:
        s = summarize(Path(a))
        roles = ", ".join(f"{k} {v}" for k, v in s["by_role"].items())
        print(
            f"| {s['input']} | {s['trees']} | {s['success']:.3f} | {s['agents_mean']:.2f} | "
            f"{s['tokens_mean']:.0f}, {s['tokens_max']} | {roles} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
