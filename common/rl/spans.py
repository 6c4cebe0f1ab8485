"""Launch-statement spans: which output tokens the delegation reward trains (SPEC.md §4).

The Delegation stage trains only the tokens of the *launch statement*: the Python statement that calls
``launch_subagent(...)`` (TextCraft, CodeAct) or the ``<delegate>...</delegate>`` block (TextWorld-Sync).
This module finds those statements as **character spans** of the reply text and maps them onto
**output token indices** through per-token character offsets:

    reply text ──(ast / regex)──> char spans ──(token char offsets)──> token mask

Alignment is never guessed. When a token's offsets are unknown or inconsistent, or a span is not fully
covered by tokens, :func:`char_spans_to_token_mask` says ``aligned=False`` and the caller drops the
datum and counts it.

Everything here is pure Python (no torch); the tokenizer is only touched by :func:`token_char_offsets`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from typing import Any

from common.envs.textcraft.codeact import parse_codeact_reply  # the parser whose block the runtime runs

Span = tuple[int, int]
"""A half-open character range ``[start, end)``."""

LAUNCH_NAME = "launch_subagent"

# Compound statements: a launch in their *header* (``for r in await launch_subagent(...):``) is trained
# up to the end of that header expression, never the whole body.
_COMPOUND = (
    ast.If,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.With,
    ast.AsyncWith,
    ast.Try,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Match,
)
_BODY_FIELDS = {"body", "orelse", "finalbody", "handlers", "cases"}
_NEWLINE = re.compile(r"\r\n|\r|\n")
_DELEGATE_BLOCK = re.compile(r"<delegate>.*?(?:</delegate\s*>|\Z)", re.DOTALL | re.IGNORECASE)
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)


# ---- spans in code --------------------------------------------------------------------------------
def _is_launch_ref(node: ast.AST) -> bool:
    """A load of ``launch_subagent`` (``launch_subagent(...)``, ``tools.launch_subagent``, ``map(launch_subagent, ..)``)."""
    if isinstance(node, ast.Name):
        return node.id == LAUNCH_NAME and isinstance(node.ctx, ast.Load)
    if isinstance(node, ast.Attribute):
        return node.attr == LAUNCH_NAME and isinstance(node.ctx, ast.Load)
    return False


def _parse(code: str) -> tuple[ast.Module, int] | None:
    """Parse a code cell (top-level ``await`` allowed) -> ``(module, line_shift)``, or None.

    A uniformly indented cell ("\\n    x = 1\\n    y = 2") is parsed under a dummy ``if True:`` header:
    columns are unchanged and line numbers shift by one (``line_shift``).
    """
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    try:
        return compile(code, "<cell>", "exec", flags=flags), 0
    except (SyntaxError, ValueError):
        pass
    try:
        wrapped = compile("if True:\n" + code, "<cell>", "exec", flags=flags)
    except (SyntaxError, ValueError):
        return None
    return ast.Module(body=wrapped.body[0].body, type_ignores=[]), 1


def launch_statement_char_spans(code_text: str, offset_in_reply: int = 0) -> list[Span]:
    """Char spans of every statement in ``code_text`` that calls ``launch_subagent``.

    * A launch inside a simple statement -> that whole statement, so
      ``r = await asyncio.gather(launch_subagent(a), launch_subagent(b))`` is ONE span.
    * A launch inside a ``for``/``if``/``def``/``with`` body -> the innermost enclosing simple statement.
    * A launch in a compound statement's header (``for r in await launch_subagent(a):``) -> from the
      statement's start to the end of that header expression (the body is not included).
    * Code that does not parse but mentions ``launch_subagent`` -> the whole code is one span.
    * No ``launch_subagent`` at all -> ``[]``.

    Spans are sorted, non-overlapping and shifted by ``offset_in_reply``.

    >>> code = 'x = 1\\nr = await launch_subagent({"a1_i5": 2})\\nprint(r)'
    >>> launch_statement_char_spans(code)
    [(6, 45)]
    >>> code[6:45]
    'r = await launch_subagent({"a1_i5": 2})'
    >>> launch_statement_char_spans("for t in ts:\\n    await launch_subagent(t)", offset_in_reply=100)
    [(117, 141)]
    >>> launch_statement_char_spans("launch_subagent(((")   # unparseable -> whole code
    [(0, 18)]
    """
    if LAUNCH_NAME not in code_text:
        return []
    parsed = _parse(code_text)
    if parsed is None:
        return [(offset_in_reply, offset_in_reply + len(code_text))]
    tree, line_shift = parsed

    # char offset of the start of each (1-based) line, for converting ast positions.
    line_starts = [0] + [m.end() for m in _NEWLINE.finditer(code_text)]
    line_ends = line_starts[1:] + [len(code_text)]
    lines = [code_text[s:e] for s, e in zip(line_starts, line_ends, strict=True)]

    def to_char(lineno: int, col_utf8: int) -> int:
        # ast columns are UTF-8 *byte* offsets within the line.
        i = lineno - 1 - line_shift
        return line_starts[i] + len(lines[i].encode("utf-8")[:col_utf8].decode("utf-8"))

    def node_span(node: ast.AST) -> Span:
        return (
            to_char(node.lineno, node.col_offset),
            to_char(node.end_lineno, node.end_col_offset),
        )

    spans: list[Span] = []

    def visit(node: ast.AST, stmt: ast.stmt | None, header: ast.AST | None) -> None:
        for field, value in ast.iter_fields(node):
            for child in value if isinstance(value, list) else [value]:
                if not isinstance(child, ast.AST):
                    continue
                if isinstance(child, ast.stmt):
                    visit(child, child, None)
                    continue
                child_header = header
                if node is stmt and isinstance(node, _COMPOUND) and field not in _BODY_FIELDS:
                    child_header = child  # a direct header part of a compound statement
                if _is_launch_ref(child) and stmt is not None:
                    spans.append(_statement_span(stmt, child_header, child, node_span))
                visit(child, stmt, child_header)

    visit(tree, None, None)
    return [(s + offset_in_reply, e + offset_in_reply) for s, e in _merge(spans)]


def _statement_span(stmt: ast.stmt, header: ast.AST | None, ref: ast.AST, node_span: Any) -> Span:
    """The trained span for one launch reference inside ``stmt`` (see launch_statement_char_spans)."""
    if not isinstance(stmt, _COMPOUND):
        return node_span(stmt)
    if isinstance(header, ast.withitem):  # ``with``-items carry no positions; their expressions do
        last = header.optional_vars or header.context_expr
        header_span = (node_span(header.context_expr)[0], node_span(last)[1])
    elif header is not None and getattr(header, "end_lineno", None) is not None:
        header_span = node_span(header)
    else:
        return node_span(ref)
    start = min(node_span(stmt)[0], header_span[0])  # decorators start before ``def``
    return (start, header_span[1])  # e.g. a launch inside an ``except`` type: train the reference itself


def _merge(spans: Sequence[Span]) -> list[Span]:
    """Sort spans, drop empty ones, merge overlapping or touching ones.

    >>> _merge([(5, 9), (0, 3), (2, 4), (9, 9), (9, 12)])
    [(0, 4), (5, 12)]
    """
    out: list[Span] = []
    for s, e in sorted(sp for sp in spans if sp[1] > sp[0]):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


# ---- spans in a reply -----------------------------------------------------------------------------
def delegate_block_char_spans(reply: str) -> list[Span]:
    """Char spans of every ``<delegate>...</delegate>`` block, tags included (unclosed -> to the end).

    Tags match case-insensitively (as the TextWorld-Sync protocol parses them); blocks inside a
    ``<think>...</think>`` section are ignored (the protocol strips those before parsing).

    >>> reply = '<thought>split</thought><delegate>{"goal": "cook dish_1"}</delegate>'
    >>> delegate_block_char_spans(reply)
    [(24, 68)]
    >>> delegate_block_char_spans("<delegate>{")
    [(0, 11)]
    """
    thinking = [(m.start(), m.end()) for m in _THINK_BLOCK.finditer(reply)]
    return [
        (m.start(), m.end())
        for m in _DELEGATE_BLOCK.finditer(reply)
        if not any(a <= m.start() < b for a, b in thinking)
    ]


def reply_launch_spans(reply: str) -> list[Span]:
    """All launch spans of one model reply, as char offsets into ``reply``.

    The ``<python>`` block the CodeAct runtime executes -- located by the runtime's own parser
    (:func:`common.envs.textcraft.codeact.parse_codeact_reply`), so a ``<python>`` mentioned inside a
    closed ``<thought>`` is skipped; a missing ``</python>`` is tolerated because generation may stop at
    it -- is searched with :func:`launch_statement_char_spans`; ``<delegate>`` blocks are added.

    >>> reply = "<thought>delegate</thought><python>r = await launch_subagent({'m0_i1': 2})</python>"
    >>> [reply[s:e] for s, e in reply_launch_spans(reply)]
    ["r = await launch_subagent({'m0_i1': 2})"]
    >>> reply = "<thought>use <python>launch_subagent(x)</python> later</thought><python>y = 1</python>"
    >>> reply_launch_spans(reply)        # the launch in the thought is never executed: nothing trained
    []
    """
    spans: list[Span] = []
    code_span = parse_codeact_reply(reply).code_span
    if code_span is not None:
        start, end = code_span
        spans += launch_statement_char_spans(reply[start:end], offset_in_reply=start)
    spans += delegate_block_char_spans(reply)
    return _merge(spans)


# ---- chars -> tokens ------------------------------------------------------------------------------
def token_char_offsets(
    tokenizer: Any, output_ids: Sequence[int], skip_special_tokens: bool = False
) -> list[Span | None]:
    """Per-token ``(start, end)`` char offsets into ``tokenizer.decode(output_ids)``, token-exact.

    Token i covers the characters that appear when it is appended: with ``p_i = decode(ids[:i+1])``,
    token i is ``[len(p_{i-1}), len(p_i))``. This works for any HF tokenizer and never re-tokenises.
    A token that ends in the middle of a multi-byte UTF-8 character decodes to a trailing U+FFFD; such
    tokens and the token that completes the character share the character range they produce together
    (a superset, never a guess). A prefix that is not a prefix of the full text for any other reason
    (a decoder that rewrites earlier text) gives ``None`` = misaligned for the tokens involved.
    Special tokens skipped by ``skip_special_tokens`` get an empty span.

    Cost: one decode per token (O(n^2) characters); about 1 s for 3,000 tokens with a fast tokenizer.

    Example with a toy tokenizer whose decode is plain concatenation:

    >>> class Toy:
    ...     vocab = {0: "r = ", 1: "await ", 2: "launch_subagent", 3: "(t)"}
    ...     def decode(self, ids, skip_special_tokens=False):
    ...         return "".join(self.vocab[i] for i in ids)
    >>> token_char_offsets(Toy(), [0, 1, 2, 3])
    [(0, 4), (4, 10), (10, 25), (25, 28)]
    """
    ids = list(output_ids)
    full = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    offsets: list[Span | None] = []
    committed = 0  # chars of ``full`` produced by the tokens before the pending run
    pending: list[int] = []  # token indices waiting for a multi-byte character to complete
    for i in range(len(ids)):
        prefix = tokenizer.decode(ids[: i + 1], skip_special_tokens=skip_special_tokens)
        offsets.append(None)
        if full.startswith(prefix) and len(prefix) >= committed:
            for j in [*pending, i]:
                offsets[j] = (committed, len(prefix))
            committed, pending = len(prefix), []
            continue
        common = common_prefix_len(prefix, full)
        if common >= committed and set(prefix[common:]) == {"\ufffd"}:
            pending.append(i)  # incomplete UTF-8 sequence: wait for the completing token
            continue
        pending = []  # the decoder rewrote earlier text: these tokens stay None (misaligned)
    return offsets


def common_prefix_len(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings.

    >>> common_prefix_len("launch_sub", "launch_subagent")
    10
    """
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def char_spans_to_token_mask(
    token_offsets: Sequence[Span | None], spans: Sequence[Span]
) -> tuple[list[int], bool]:
    """Mask of the output tokens whose char range overlaps any span; ``aligned`` says it is exact.

    A token ``[s, e)`` is in span ``[a, b)`` iff ``max(s, a) < min(e, b)`` (empty tokens never are).
    ``aligned`` is False (the caller drops and counts the datum) when
      * a token's offsets are missing (``None``) and it could lie inside a span,
      * offsets are inconsistent (``end < start``, or a token starts before the previous one ended,
        except tokens sharing one multi-byte character's range),
      * some character of a span is covered by no token (span beyond the text, or a gap).

    Shapes: ``token_offsets`` [T] -> ``mask`` [T] of 0/1.

    >>> offsets = [(0, 4), (4, 10), (10, 25), (25, 28), (28, 29)]   # "r = await launch_subagent(t)\\n"
    >>> char_spans_to_token_mask(offsets, [(4, 28)])
    ([0, 1, 1, 1, 0], True)
    >>> char_spans_to_token_mask(offsets, [(20, 40)])              # runs past the text
    ([0, 0, 1, 1, 1], False)
    """
    mask = [0] * len(token_offsets)
    aligned = True
    # 1) consistency of the known offsets (monotone, non-negative width)
    prev: Span = (0, 0)  # the last known token
    for off in token_offsets:
        if off is None:
            continue
        s, e = off
        # tokens of one multi-byte character share its range (token_char_offsets); any other token
        # must start where the previous one ended or later
        if e < s or (s < prev[1] and off != prev):
            aligned = False
        prev = off
    # 2) mark tokens; a None token could sit anywhere between its known neighbours
    ranges = _possible_ranges(token_offsets)
    for t, off in enumerate(token_offsets):
        if off is None:
            lo, hi = ranges[t]
            if any(max(lo, a) < min(hi, b) for a, b in spans):
                aligned = False
            continue
        s, e = off
        if any(max(s, a) < min(e, b) for a, b in spans):
            mask[t] = 1
    # 3) every char of every span covered by some known token
    covered = _merge([off for off in token_offsets if off is not None])
    for a, b in spans:
        if b > a and not any(s <= a and b <= e for s, e in covered):
            aligned = False
    return mask, aligned


def _possible_ranges(token_offsets: Sequence[Span | None]) -> list[Span]:
    """Where each token could lie given its known neighbours (conservative: used only for ``None`` tokens).

    Token t lies somewhere in ``[start of the last known token before t, end of the next known token
    after t)`` (``0`` / infinity when there is none): a decoder that rewrote text may have attributed
    a ``None`` token's characters to a neighbour.

    >>> _possible_ranges([(0, 2), None, (2, 5)])
    [(0, 2), (0, 5), (2, 5)]
    """
    n = len(token_offsets)
    lo, hi = [0] * n, [0] * n
    last_start = 0
    for t in range(n):
        if token_offsets[t] is not None:
            last_start = token_offsets[t][0]
        lo[t] = last_start
    next_end = 1 << 62
    for t in range(n - 1, -1, -1):
        if token_offsets[t] is not None:
            next_end = token_offsets[t][1]
        hi[t] = next_end
    return list(zip(lo, hi, strict=True))
