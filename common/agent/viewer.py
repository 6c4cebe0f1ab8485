"""Look at recorded recursive agent trees: a rich terminal view and one self-contained HTML page.

* :func:`render_tree_terminal` prints a tree as a ``rich.tree.Tree``: per node its id, depth, goal,
  steps used/max, finished/error, environment success, rubric score and branch information.
* :func:`write_html` writes ONE HTML file (inline CSS and JS, no external assets, works offline from
  ``file://``; ``view.html#t0-n2`` opens tree 0, node 2 directly): a list of trees; per tree a
  collapsible tree of nodes (the page opens scrolled to the top: element ids are ``v-`` + the
  fragment, so the browser never jumps to one); clicking a node shows its
  per-step transcript (reply, observation), its frozen rubric (items with weights), its score and
  reason, the raw rubric/score outputs and any errors. Every piece of recorded text is escaped with
  ``html.escape``, so model output such as ``<script>`` shows as text.

Simplifications: the whole log is rendered into the page up front (no lazy loading), and of the
per-step prompt messages only the first step's are shown (later ones repeat the history).

Run::

    python -m common.agent.viewer runs/x/trees.jsonl                 # terminal view
    python -m common.agent.viewer runs/x/trees.jsonl --html view.html
"""

from __future__ import annotations

import argparse
import html
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text
from rich.tree import Tree as RichTree

from common.agent.rubric import ScoreParseError, parse_score
from common.agent.tree import CallRecord, Node, Tree


# ---- shared helpers ----------------------------------------------------------------------------------
def _ordered_children(tree: Tree, node_id: str) -> list[Node]:
    return sorted(
        tree.children(node_id),
        key=lambda n: (n.fork_step if n.fork_step is not None else -1, n.branch_index or 0, n.node_id),
    )


def _short(text: str | None, n: int = 90) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _branch_info(node: Node) -> str:
    if node.branch_group is None:
        return ""
    label = {True: "✓", False: "✗", None: "?"}[node.branch_label]
    return f"branch {node.branch_group}#{node.branch_index} label {label}"


def score_reason(node: Node) -> str | None:
    """The scorer's reason, re-parsed from the recorded score call (None when unavailable)."""
    if node.score_call is None:
        return None
    try:
        return parse_score(node.score_call.text).reason
    except ScoreParseError:
        return None


# ---- terminal ------------------------------------------------------------------------------------------
def _node_label(node: Node) -> Text:
    t = Text()
    t.append(f"node {node.node_id}", style="bold")
    t.append(f"  d{node.depth}  steps {node.steps_used}/{node.max_steps}  ")
    if node.error:
        t.append(f"error: {_short(node.error, 60)}", style="bold red")
    elif node.finished:
        t.append("finished", style="green")
    else:
        t.append("not finished", style="yellow")
    t.append("  success ")
    t.append("✓" if node.success else "✗", style="green" if node.success else "red")
    if node.parent_id is not None:
        if node.score is not None:
            t.append(f"  s={node.score:.2f}", style="cyan")
            if node.score_success is not None:
                t.append(" (gate ✓)" if node.score_success else " (gate ✗)", style="cyan")
        elif node.score_error:
            t.append(f"  score error: {_short(node.score_error, 40)}", style="red")
        if node.rubric is None:
            t.append(
                "  no rubric" + (f": {_short(node.rubric_error, 40)}" if node.rubric_error else ""),
                style="red",
            )
    info = _branch_info(node)
    if info:
        t.append(f"  {info}", style="magenta")
    if not node.committed:
        t.append("  uncommitted", style="dim")
    t.append(f"\n{_short(node.goal)}", style="italic")
    return t


def render_tree_terminal(tree: Tree, console: Console | None = None) -> RichTree:
    """Print ``tree`` to ``console`` (a new Console when None) and return the rich Tree."""
    head = Text()
    head.append(f"task {tree.task_id}", style="bold")
    head.append(f"  env {tree.env}  nodes {len(tree.nodes)}  root success ")
    head.append("✓" if tree.success else "✗", style="green" if tree.success else "red")
    if tree.seconds:
        head.append(f"  {tree.seconds:.1f}s")
    out = RichTree(head)

    def add(branch: RichTree, node: Node) -> None:
        sub = branch.add(_node_label(node), style="dim" if not node.committed else "")
        for child in _ordered_children(tree, node.node_id):
            add(sub, child)

    if tree.root_id in tree.nodes:
        add(out, tree.root)
    (console or Console()).print(out)
    return out


# ---- HTML -------------------------------------------------------------------------------------------------
def e(x: Any) -> str:
    """Escape any value for HTML text or attribute content."""
    return html.escape("" if x is None else str(x), quote=True)


CSS = """
*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,sans-serif;color:#1d232b;background:#f4f5f7}
header{background:#1d2b3a;color:#fff;padding:10px 16px}header h1{margin:0;font-size:18px}
#wrap{display:flex;min-height:calc(100vh - 44px)}
#trees{width:230px;flex:none;background:#fff;border-right:1px solid #d8dce2;overflow:auto;padding:8px 0}
#trees a{display:block;padding:5px 12px;color:inherit;text-decoration:none;border-left:3px solid transparent}
#trees a.sel{background:#e8f0fb;border-left-color:#2f6fd0}#trees a:hover{background:#f0f3f7}
main{flex:1;min-width:0;padding:12px 16px}
.tree-head{margin-bottom:10px}.tree-body{display:flex;gap:14px;align-items:flex-start}
.nav{width:340px;flex:none;background:#fff;border:1px solid #d8dce2;border-radius:6px;padding:8px;overflow:auto}
.nav ul{list-style:none;margin:0;padding-left:16px}.nav>ul{padding-left:0}
.node-btn{font:inherit;text-align:left;border:1px solid transparent;background:none;padding:2px 5px;
 border-radius:4px;cursor:pointer;display:inline-block;vertical-align:top;width:calc(100% - 24px)}
.node-btn:hover{background:#f0f3f7}.node-btn.sel{background:#e8f0fb;border-color:#2f6fd0}
summary{cursor:pointer}.leaf{padding-left:14px}
.detail{flex:1;min-width:0}.node-detail{background:#fff;border:1px solid #d8dce2;border-radius:6px;padding:10px 14px}
.ok{color:#17803d;font-weight:600}.bad{color:#c0262d;font-weight:600}.muted{color:#6b7480}
.badge{display:inline-block;padding:0 6px;border-radius:8px;background:#eef0f3;margin-left:4px;font-size:12px}
table{border-collapse:collapse;width:100%;margin:6px 0}td,th{border:1px solid #d8dce2;padding:3px 6px;
 vertical-align:top;text-align:left}th{background:#f0f3f7}
pre{white-space:pre-wrap;word-break:break-word;margin:0;font:12.5px/1.4 ui-monospace,monospace}
.step{border:1px solid #d8dce2;border-radius:6px;margin:8px 0;overflow:hidden}
.step h4{margin:0;padding:4px 8px;background:#f0f3f7;font-size:13px}
.reply{padding:6px 8px;background:#fbfcfe}.obs{padding:6px 8px;background:#f6fbf6;border-top:1px dashed #d8dce2}
.label{font-size:11px;text-transform:uppercase;letter-spacing:.05em;color:#6b7480}
.error{background:#fdecec;border:1px solid #f2b8b8;border-radius:6px;padding:6px 8px;margin:6px 0}
h3{margin:4px 0 8px}h4.sec{margin:14px 0 4px;border-bottom:1px solid #d8dce2}
"""

JS = """
// Fragment keys (t0, t0-n2) name trees and nodes; the elements' ids are 'v-' + key, so no element
// matches the URL fragment and the browser never scrolls the page down to one: it opens at the top.
function el(key){ return document.getElementById('v-' + key); }
function showTree(key){
  document.querySelectorAll('section.tree').forEach(function(s){s.hidden = s.dataset.key !== key;});
  document.querySelectorAll('#trees a').forEach(function(a){a.classList.toggle('sel', a.dataset.tree === key);});
  var sec = el(key);
  if (sec && !sec.querySelector('.node-btn.sel')) { var b = sec.querySelector('.node-btn'); if (b) showNode(b.dataset.node); }
}
function showNode(key){
  var d = el(key); if (!d) return;
  var sec = d.closest('section.tree');
  sec.querySelectorAll('.node-detail').forEach(function(x){x.hidden = x.dataset.key !== key;});
  sec.querySelectorAll('.node-btn').forEach(function(b){b.classList.toggle('sel', b.dataset.node === key);});
  if (history.replaceState) history.replaceState(null, '', '#' + key);
}
document.addEventListener('click', function(ev){
  var t = ev.target.closest('[data-tree]');
  if (t) { ev.preventDefault(); showTree(t.dataset.tree); return; }
  var n = ev.target.closest('[data-node]');
  if (n) { ev.preventDefault(); showNode(n.dataset.node); }
});
if ('scrollRestoration' in history) history.scrollRestoration = 'manual';
document.addEventListener('DOMContentLoaded', function(){
  // A link such as view.html#t0-n2 opens that node (tree k, node j); otherwise the first tree's root.
  var target = location.hash ? el(location.hash.slice(1)) : null;
  if (target && target.classList.contains('node-detail')) {
    showTree(target.closest('section.tree').dataset.key); showNode(target.dataset.key);
  } else if (target && target.matches('section.tree')) { showTree(target.dataset.key); }
  else { var first = document.querySelector('#trees a'); if (first) showTree(first.dataset.tree); }
  window.scrollTo(0, 0);
});
"""


def _yes_no(flag: bool | None, yes: str = "yes", no: str = "no") -> str:
    if flag is None:
        return '<span class="muted">n/a</span>'
    return f'<span class="ok">{yes}</span>' if flag else f'<span class="bad">{no}</span>'


def _pre(text: Any) -> str:
    return f"<pre>{e(text)}</pre>"


def _messages_html(messages: list[dict[str, str]]) -> str:
    parts = []
    for m in messages:
        parts.append(f'<div class="label">{e(m.get("role", "?"))}</div>{_pre(m.get("content", ""))}')
    return "".join(parts) or '<span class="muted">(none recorded)</span>'


_NO_RUBRIC_CALLS = (
    "<p class=muted>(no rubric or score call at this node; its own replies are in the transcript below)</p>"
)
"""Shown where a node made no rubric/score call (a root, or a run without rubrics): a bare "(none)" under
"raw model outputs" read as "no model output" next to the node's visible replies."""


def _call_html(title: str, call: CallRecord | None) -> str:
    if call is None:
        return ""
    meta = (
        f"{len(call.prompt_ids)} prompt tokens, {len(call.output_ids)} output tokens, "
        f"finish {call.finish_reason}, sampling {json.dumps(call.sampling, default=str)}"
        + (", prompt truncated" if call.prompt_truncated else "")
    )
    return (
        f"<details><summary>{e(title)} <span class='muted'>({e(meta)})</span></summary>"
        f"<div class='label'>output</div>{_pre(call.text)}"
        f"<details><summary>prompt messages</summary>{_messages_html(call.messages)}</details></details>"
    )


def _rubric_html(node: Node) -> str:
    r = node.rubric
    if r is None:
        msg = "no rubric" + ("" if node.rubric_error else " (root, or not recorded)")
        out = f'<p class="muted">{e(msg)}</p>'
        if node.rubric_error:
            out += f'<div class="error"><b>rubric error:</b> {e(node.rubric_error)}</div>'
        return out
    rows = []
    items = r.get("rubric_items") if isinstance(r, dict) else None
    for it in items if isinstance(items, list) else []:
        it = it if isinstance(it, dict) else {"name": it}
        w = it.get("weight")
        w_txt = f"{w:.3f} ({w * 100:.1f}%)" if isinstance(w, (int, float)) else e(w)
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{e(v)}</td>"
                for v in (
                    it.get("name"),
                    w_txt,
                    it.get("description"),
                    it.get("score_0"),
                    it.get("score_full"),
                )
            )
            + "</tr>"
        )
    fcs = r.get("failure_conditions") or []
    fc_html = "".join(f"<li>{e(c)}</li>" for c in (fcs if isinstance(fcs, list) else [fcs]))
    return (
        "<table class='rubric'><tr><th>item</th><th>weight</th><th>description</th><th>score 0</th>"
        f"<th>full score</th></tr>{''.join(rows)}</table>"
        f"<p><b>success gate:</b> {e(r.get('success_gate'))}</p>"
        f"<p><b>failure conditions:</b></p><ul>{fc_html or '<li class=muted>(none)</li>'}</ul>"
        f"<p><b>scoring procedure:</b> {e(r.get('scoring_procedure'))}</p>"
    )


def _score_html(node: Node) -> str:
    if node.parent_id is None:
        return '<p class="muted">the root is rewarded by the environment, not scored</p>'
    out = ""
    if node.score is not None:
        out += f"<p><b>s = {node.score:.3f}</b> &nbsp; scorer says success: {_yes_no(node.score_success)}</p>"
        reason = score_reason(node)
        if reason:
            out += f"<p><b>reason:</b> {e(reason)}</p>"
    else:
        out += '<p class="muted">no score</p>'
    if node.score_error:
        out += f'<div class="error"><b>score error:</b> {e(node.score_error)}</div>'
    return out


def _node_ref(dom_ids: dict[str, str], node_id: str | None) -> str:
    if node_id is None:
        return '<span class="muted">none</span>'
    if node_id not in dom_ids:
        return e(node_id)
    return f'<a href="#" data-node="{dom_ids[node_id]}">{e(node_id)}</a>'


def _node_detail(tree: Tree, node: Node, dom_ids: dict[str, str]) -> str:
    facts = [
        ("goal", e(node.goal)),
        ("parent", _node_ref(dom_ids, node.parent_id)),
        ("depth", e(node.depth)),
        ("fork step", e(node.fork_step)),
        ("steps", e(f"{node.steps_used}/{node.max_steps}")),
        ("finished", _yes_no(node.finished)),
        ("finish message", e(node.finish_message)),
        ("environment success", _yes_no(node.success)),
        ("committed", _yes_no(node.committed)),
        ("seconds", e(f"{node.seconds:.2f}")),
    ]
    if node.branch_group is not None:
        facts.append(("branch", e(f"group {node.branch_group}, index {node.branch_index}")))
        facts.append(("branch label", _yes_no(node.branch_label, "success", "failure")))
    children = _ordered_children(tree, node.node_id)
    if children:
        facts.append(("children", ", ".join(_node_ref(dom_ids, c.node_id) for c in children)))
    table = "<table>" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts) + "</table>"
    errors = f'<div class="error"><b>error:</b> {_pre(node.error)}</div>' if node.error else ""

    steps = []
    for s in node.steps:
        launched = ""
        if s.launched:
            launched = "<p>launched: " + ", ".join(_node_ref(dom_ids, c) for c in s.launched) + "</p>"
        if s.refused_launches:
            launched += f"<p class='bad'>{e(s.refused_launches)} launch(es) refused</p>"
        steps.append(
            f"<div class='step'><h4>step {e(s.index + 1)} "
            f"<span class='muted'>({len(s.call.output_ids)} tokens, finish {e(s.call.finish_reason)}"
            f"{', prompt truncated' if s.call.prompt_truncated else ''})</span></h4>"
            f"<div class='reply'><div class='label'>reply</div>{_pre(s.call.text)}</div>"
            f"<div class='obs'><div class='label'>observation</div>{_pre(s.observation)}{launched}</div></div>"
        )
    prompt = ""
    if node.steps:
        prompt = (
            "<details><summary>prompt messages of step 1</summary>"
            f"{_messages_html(node.steps[0].call.messages)}</details>"
        )
    return (
        f"<div class='node-detail' id='v-{dom_ids[node.node_id]}' data-key='{dom_ids[node.node_id]}' hidden>"
        f"<h3>node {e(node.node_id)}</h3>{table}{errors}"
        f"<h4 class='sec'>rubric (frozen before the child ran)</h4>{_rubric_html(node)}"
        f"<h4 class='sec'>score</h4>{_score_html(node)}"
        f"<h4 class='sec'>rubric and score calls (raw model outputs)</h4>"
        f"{_call_html('rubric call', node.rubric_call)}{_call_html('score call', node.score_call)}"
        f"{'' if node.rubric_call or node.score_call else _NO_RUBRIC_CALLS}"
        f"<h4 class='sec'>transcript</h4>{prompt}{''.join(steps) or '<p class=muted>(no steps)</p>'}"
        "</div>"
    )


def _nav_item(tree: Tree, node: Node, dom_ids: dict[str, str]) -> str:
    mark = "✓" if node.success else ("!" if node.error else "✗")
    cls = "ok" if node.success else "bad"
    badges = f"<span class='badge'>{node.steps_used}/{node.max_steps}</span>"
    if node.score is not None:
        badges += f"<span class='badge'>s={node.score:.2f}</span>"
    if node.branch_group is not None:
        badges += f"<span class='badge'>br {e(node.branch_index)}</span>"
    if not node.committed:
        badges += "<span class='badge'>uncommitted</span>"
    button = (
        f"<button class='node-btn' data-node='{dom_ids[node.node_id]}'>"
        f"<span class='{cls}'>{mark}</span> <b>{e(node.node_id)}</b> {badges}"
        f"<br><span class='muted'>{e(_short(node.goal, 60))}</span></button>"
    )
    children = _ordered_children(tree, node.node_id)
    if not children:
        return f"<li class='leaf'>{button}</li>"
    inner = "".join(_nav_item(tree, c, dom_ids) for c in children)
    return f"<li><details open><summary>{button}</summary><ul>{inner}</ul></details></li>"


def _tree_section(k: int, tree: Tree) -> str:
    dom_ids = {nid: f"t{k}-n{j}" for j, nid in enumerate(tree.nodes)}
    nav = (
        _nav_item(tree, tree.root, dom_ids)
        if tree.root_id in tree.nodes
        else "<li class='bad'>root missing</li>"
    )
    # Nodes not reachable from the root (should not happen) are still listed, so nothing is hidden.
    reachable: set[str] = set()
    stack = [tree.root_id]
    while stack:
        nid = stack.pop()
        if nid in reachable:
            continue
        reachable.add(nid)
        stack.extend(c.node_id for c in tree.children(nid))
    orphans = [n for n in tree.nodes.values() if n.node_id not in reachable]
    nav += "".join(_nav_item(tree, n, dom_ids) for n in orphans if n.parent_id not in tree.nodes)
    details = "".join(_node_detail(tree, n, dom_ids) for n in tree.nodes.values())
    meta = json.dumps(tree.meta, indent=1, default=str, sort_keys=True) if tree.meta else ""
    leaves = len(tree.leaves()) if tree.root_id in tree.nodes else 0
    head = (
        f"<div class='tree-head'><h2 style='margin:0'>{e(tree.task_id)} "
        f"<span class='badge'>{e(tree.env)}</span></h2>"
        f"root success: {_yes_no(tree.success)} &nbsp; nodes: {len(tree.nodes)} &nbsp; leaves: {leaves}"
        f" &nbsp; seconds: {tree.seconds:.1f}"
        + (f" &nbsp; config: <code>{e(tree.config_hash)}</code>" if tree.config_hash else "")
        + (f"<details><summary>meta</summary>{_pre(meta)}</details>" if meta else "")
        + "</div>"
    )
    return (
        f"<section class='tree' id='v-t{k}' data-key='t{k}' hidden>{head}<div class='tree-body'>"
        f"<nav class='nav'><ul>{nav}</ul></nav><div class='detail'>{details}</div></div></section>"
    )


def render_html(trees: Sequence[Tree], title: str = "SERA rollout trees") -> str:
    """The whole page as a string (see :func:`write_html`)."""
    items = []
    for k, t in enumerate(trees):
        mark = "<span class='ok'>✓</span>" if t.success else "<span class='bad'>✗</span>"
        items.append(
            f"<a href='#' data-tree='t{k}'>{mark} {e(t.task_id)}<br>"
            f"<span class='muted'>{e(t.env)} · {len(t.nodes)} nodes</span></a>"
        )
    sections = "".join(_tree_section(k, t) for k, t in enumerate(trees))
    n_ok = sum(t.success for t in trees)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{e(title)}</title>"
        f"<style>{CSS}</style></head><body>"
        f"<header><h1>{e(title)} <span style='font-weight:400;font-size:14px'>"
        f"{len(trees)} trees, {n_ok} root successes</span></h1></header>"
        f"<div id='wrap'><nav id='trees'>{''.join(items) or '<p class=muted>(no trees)</p>'}</nav>"
        f"<main>{sections}</main></div><script>{JS}</script></body></html>\n"
    )


def write_html(trees: Sequence[Tree], out_path: str | os.PathLike, title: str = "SERA rollout trees") -> Path:
    """Write one self-contained HTML page for ``trees``; returns the path written."""
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(render_html(trees, title), encoding="utf-8")
    os.replace(tmp, out)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    from common.agent.log import read_trees

    ap = argparse.ArgumentParser(description="View a SERA tree log in the terminal or as an HTML page.")
    ap.add_argument("log", help="a trees.jsonl written by common.agent.log.append_tree")
    ap.add_argument("--html", help="write a self-contained HTML page here instead of printing")
    ap.add_argument("--limit", type=int, default=None, help="only the first N trees")
    args = ap.parse_args(argv)
    trees = read_trees(args.log)[: args.limit]
    if args.html:
        print(f"wrote {write_html(trees, args.html)} ({len(trees)} trees)")
        return
    console = Console()
    for t in trees:
        render_tree_terminal(t, console)


if __name__ == "__main__":
    main()
