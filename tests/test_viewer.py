"""Tests of common/agent/viewer.py: terminal rendering, the HTML page (structure, escaping), and a
headless-Chromium screenshot of the page when /usr/bin/chromium is installed."""

from __future__ import annotations

import html.parser
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from common.agent.rubric import parse_rubric
from common.agent.tree import CallRecord, Node, Step, Tree
from common.agent.viewer import render_html, render_tree_terminal, write_html

RUBRIC_TEXT = json.dumps(
    {
        "rubric_items": [
            {
                "name": "crafted a1_i4",
                "weight": 3,
                "description": "2 more a1_i4",
                "score_0": "none",
                "score_full": "2",
            },
            {
                "name": "no waste",
                "weight": 1,
                "description": "ores kept",
                "score_0": "all used",
                "score_full": "ok",
            },
        ],
        "success_gate": "a1_i4 count rose by 2",
        "failure_conditions": ["crashed"],
        "scoring_procedure": "weighted sum",
    }
)
SCORE_TEXT = (
    '{"success": true, "criterion_scores": [1, 0.5], "final_score": 0.875, "reason": "crafted <both>"}'
)


def _call(text: str, role: str = "act") -> CallRecord:
    return CallRecord(
        role=role,
        messages=[{"role": "system", "content": "SYS <b>"}, {"role": "user", "content": "go"}],
        text=text,
        output_ids=[1, 2, 3],
    )


def make_tree() -> Tree:
    rubric = parse_rubric(RUBRIC_TEXT).to_dict()
    root = Node(
        "0",
        None,
        0,
        None,
        "Craft the following items: 3x a1_i5",
        20,
        steps=[
            Step(0, _call("<thought>plan</thought><python>print(1)</python>"), "[Cell 1 Output]\n1"),
            Step(
                1,
                _call("await launch_subagent(...) <script>alert(1)</script>"),
                "done & dusted",
                launched=["0.1", "0.2"],
            ),
            Step(2, _call("finish('ok')"), "finished"),
        ],
        finished=True,
        finish_message="ok",
        success=True,
    )
    c1 = Node(
        "0.1",
        "0",
        1,
        1,
        "Craft the following items: 2x a1_i4",
        20,
        steps=[Step(0, _call("craft(...)"), "Successfully crafted 2 a1_i4(s)", launched=["0.1.1"])],
        finished=True,
        finish_message="have 2",
        success=True,
        rubric=rubric,
        rubric_call=_call(RUBRIC_TEXT, "rubric"),
        score=0.875,
        score_success=True,
        score_call=_call(SCORE_TEXT, "score"),
    )
    c2 = Node(
        "0.2",
        "0",
        1,
        1,
        "Craft the following items: 1x a1_i3",
        20,
        steps=[Step(0, _call("boom()"), "Traceback ...")],
        error="RuntimeError: exploded </pre><img src=x>",
        rubric=None,
        rubric_error="rubric parse failure: no JSON object with 'rubric_items' found",
        rubric_call=_call("I refuse", "rubric"),
    )
    gc = Node(
        "0.1.1",
        "0.1",
        2,
        0,
        "Craft the following items: 1x a1_i1",
        20,
        finished=True,
        success=False,
        rubric=rubric,
        score=0.0,
        score_success=False,
        branch_group="g0",
        branch_index=1,
        branch_label=False,
        committed=False,
    )
    return Tree(
        task_id="tc-<7>",
        env="textcraft",
        nodes={n.node_id: n for n in (root, c1, c2, gc)},
        success=True,
        seconds=12.5,
        meta={"stage": "execution"},
    )


def test_render_terminal():
    console = Console(record=True, width=200, color_system=None)
    render_tree_terminal(make_tree(), console)
    out = console.export_text()
    for needle in (
        "task tc-<7>",
        "node 0 ",
        "node 0.1 ",
        "node 0.2 ",
        "node 0.1.1",
        "steps 3/20",
        "s=0.88",
        "error: RuntimeError: exploded",
        "no rubric: rubric parse failure",
        "branch g0#1 label ✗",
        "uncommitted",
        "Craft the following items: 2x a1_i4",
        "d2",
    ):
        assert needle in out, needle
    # Tree structure: the grandchild is drawn below (indented further than) its parent.
    lines = out.splitlines()
    i_child = next(i for i, ln in enumerate(lines) if "node 0.1 " in ln)
    i_grand = next(i for i, ln in enumerate(lines) if "node 0.1.1" in ln)
    assert i_grand > i_child and lines[i_grand].index("node") > lines[i_child].index("node")


def test_render_terminal_markup_is_not_interpreted():
    tree = make_tree()
    tree.nodes["0.1"].goal = "[bold red]not markup[/]"
    console = Console(record=True, width=200, color_system=None)
    render_tree_terminal(tree, console)
    assert "[bold red]not markup[/]" in console.export_text()


class _Collector(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def test_write_html_structure_and_escaping(tmp_path):
    trees = [make_tree(), make_tree()]
    trees[1].task_id = "second"
    trees[1].success = False
    out = write_html(trees, tmp_path / "sub" / "view.html")
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    # Self-contained: no external resources of any kind.
    for bad in ("http://", "https://", "<link", 'src="', "@import"):
        assert bad not in page, bad
    # Escaping: the model's <script> and the error's markup appear only as text.
    assert page.count("<script>") == 1  # our own inline script
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img src=x>" not in page and "&lt;img src=x&gt;" in page
    assert "tc-&lt;7&gt;" in page and "crafted &lt;both&gt;" in page

    p = _Collector()
    p.feed(page)
    tags = p.tags
    tree_links = [a for t, a in tags if t == "a" and "data-tree" in a]
    assert [a["data-tree"] for a in tree_links] == ["t0", "t1"]
    sections = [a for t, a in tags if t == "section"]
    assert [s["data-key"] for s in sections] == ["t0", "t1"]
    buttons = [a["data-node"] for t, a in tags if t == "button"]
    assert buttons == ["t0-n0", "t0-n1", "t0-n3", "t0-n2", "t1-n0", "t1-n1", "t1-n3", "t1-n2"]
    details = [a["data-key"] for t, a in tags if t == "div" and "node-detail" in a.get("class", "")]
    assert sorted(details) == sorted(buttons)
    assert all(bid in details for bid in buttons)
    # The page opens at the top: no element id equals a fragment the page links to or writes (#t0,
    # #t1-n2), so the browser has nothing to scroll down to; each element's id is "v-" + its key.
    ids = {a["id"] for t, a in tags if "id" in a}
    assert not ids & {*buttons, "t0", "t1"}
    assert {"v-" + k for k in [*buttons, "t0", "t1"]} <= ids
    text = "".join(p.text)
    for needle in (
        "crafted a1_i4",
        "0.750 (75.0%)",
        "0.250 (25.0%)",
        "a1_i4 count rose by 2",
        "s = 0.875",
        "reason:",
        "rubric parse failure",
        "RuntimeError: exploded </pre><img src=x>",
        "Successfully crafted 2 a1_i4(s)",
        "group g0, index 1",
        "I refuse",
        '"stage": "execution"',
    ):
        assert needle in text, needle


def test_render_html_empty():
    page = render_html([])
    assert "0 trees" in page and "(no trees)" in page


CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_html_screenshot_with_headless_chromium(tmp_path):
    page = write_html([make_tree(), make_tree()], tmp_path / "view.html")
    png = tmp_path / "shot.png"
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1200,900",
    ]
    proc = subprocess.run(
        [CHROMIUM, *flags, f"--screenshot={png}", page.resolve().as_uri() + "#t1-n1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert png.exists(), f"no screenshot (rc {proc.returncode}): {proc.stderr[-2000:]}"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000, f"screenshot suspiciously small ({len(data)} bytes)"

    # The inline JS ran: the URL fragment selected tree 1 and its node 0.1 (the rest stays hidden).
    dom = subprocess.run(
        [CHROMIUM, *flags, "--dump-dom", page.resolve().as_uri() + "#t1-n1"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    p = _Collector()
    p.feed(dom)
    hidden = {
        a["data-key"]: "hidden" in a for t, a in p.tags if t in ("section", "div") and a.get("data-key")
    }
    assert hidden["t1"] is False and hidden["t0"] is True
    assert hidden["t1-n1"] is False and hidden["t1-n0"] is True and hidden["t1-n2"] is True


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_html_opens_scrolled_to_the_top_in_headless_chromium(tmp_path):
    """Opened with a node's fragment (#t1-n2, as a shared link or a reload does) in a short window, the page
    still shows its header and the tree summary: the browser's scroll position after load is 0."""
    trees = [make_tree() for _ in range(3)]
    page = render_html(trees).replace(
        "</body>",
        "<script>window.addEventListener('load', function(){ setTimeout(function(){"
        " document.body.dataset.scrolly = String(window.scrollY); }, 200); });</script></body>",
    )
    path = tmp_path / "view.html"
    path.write_text(page, encoding="utf-8")
    dom = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-dev-shm-usage",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=900,300",
            "--virtual-time-budget=3000",
            "--dump-dom",
            path.resolve().as_uri() + "#t1-n2",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    p = _Collector()
    p.feed(dom)
    body = next((a for t, a in p.tags if t == "body"), {})
    if "data-scrolly" not in body:
        pytest.skip("this chromium dumped the DOM before the load handler ran")
    assert body["data-scrolly"] == "0"
    hidden = {a["data-key"]: "hidden" in a for t, a in p.tags if a.get("data-key")}
    assert hidden["t1"] is False and hidden["t1-n2"] is False
