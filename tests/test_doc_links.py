"""Every relative link in the project's Markdown (README, docs, tutorials, tier READMEs, bench results) points at a
file or folder that exists: a moved or renamed file breaks a test instead of a reader's click."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def markdown_files() -> list[Path]:
    """The Markdown git tracks, less the recorded run outputs (their reports name machine paths)."""
    out = subprocess.run(
        ["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [ROOT / p for p in out.split() if not p.startswith("bench/runs/")]


def broken_links(path: Path) -> list[tuple[int, str]]:
    """``(line, target)`` of each relative link in ``path`` whose target does not exist (anchors and web
    addresses are not checked)."""
    bad = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        for target in LINK.findall(line):
            target = target.split("#", 1)[0]
            if target and not re.match(r"[a-z]+:", target) and not (path.parent / target).exists():
                bad.append((n, target))
    return bad


def test_every_relative_link_in_the_markdown_resolves():
    files = markdown_files()
    assert ROOT / "README.md" in files and len(files) > 10
    bad = [f"{f.relative_to(ROOT)}:{n}: {t}" for f in files for n, t in broken_links(f)]
    assert not bad, "links to nothing:\n" + "\n".join(bad)


def test_a_broken_link_is_found(tmp_path: Path):
    text = (ROOT / "README.md").read_text()
    copy = tmp_path / "x.md"
    copy.write_text("[the spec](SPEC.md#the-method) [web](https://example.org) [anchor](#here)\n"
                    "[a file that is not there](no_such_file.md)\n")  # fmt: skip
    (tmp_path / "SPEC.md").write_text("")
    assert broken_links(copy) == [(2, "no_such_file.md")]
    assert broken_links(ROOT / "README.md") == [] and text.count("](") > 5
