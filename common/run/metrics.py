"""The metrics of one rollout round: the same names and log line in every tier, written to metrics.jsonl
(strict JSON: NaN is written as null), optionally to TensorBoard, and drawn as curves.png."""

from __future__ import annotations

import json
import math
import resource
import sys
from pathlib import Path
from typing import Any

from common.rl.batch import METRIC_NAMES, tree_metrics

NO_UPDATE = {
    "loss/cispo": 0.0,
    "grad_norm": 0.0,
    "loss/tokens": 0.0,
    "loss/clip_frac": 0.0,
    "train/skipped": 1.0,
}
"""The training metrics of a round whose batch has no trained token (no optimizer step is taken)."""

LOG_KEYS = (*METRIC_NAMES, "loss/cispo", "grad_norm", "tokens_per_s")
"""The keys of the one log line per round (after ``step`` and ``stage``)."""

CURVES = (
    "reward/root_success",
    "reward/exec_mean",
    "rubric/pair_accuracy",
    "loss/cispo",
    "grad_norm",
    "tree/nodes_mean",
)
"""The six panels of curves.png."""


def peak_rss_gb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def busy_seconds(intervals: Any) -> float:
    """Wall time covered by at least one of the ``(start, end)`` intervals (their union's length), so
    calls that overlap in time count once.

    >>> busy_seconds([(0, 2), (1, 3)]), busy_seconds([(0, 1), (2, 3)]), busy_seconds([])
    (3.0, 2.0, 0.0)
    """
    total, cur_start, cur_end = 0.0, None, None
    for a, b in sorted((float(a), float(b)) for a, b in intervals):
        if b < a:
            raise ValueError(f"an interval ends before it starts: ({a}, {b})")
        if cur_end is None or a > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = a, b
        else:
            cur_end = max(cur_end, b)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def scoring_seconds(trees: list[Any]) -> float:
    """Wall time of a round's rubric and score calls: the union of the intervals in which at least one
    was in flight (each call ran in ``[ended - seconds, ended]``, ``CallRecord.ended``)."""
    calls = [c for t in trees for n in t.nodes.values() for c in (n.rubric_call, n.score_call) if c]
    return busy_seconds((c.ended - c.seconds, c.ended) for c in calls)


def timing_metrics(trees: list[Any]) -> dict[str, float]:
    """Where a round's rollout time goes (from the calls' ``[ended - seconds, ended]``): the trees' wall
    times (``time/tree_p50_s``, ``time/tree_max_s``: a synchronous round waits for its slowest tree), the
    tail of rubric/score calls after a tree's last act call (``time/tail_mean_s``, ``time/tail_max_s``: what
    SERA adds to a tree's critical path once its agents are done), and the generated tokens by call role
    (``gen/act_tokens``, ``gen/rubric_tokens``, ``gen/score_tokens``: the engine's load; ``gen/rubric_calls``,
    ``gen/score_calls``: how many).

    >>> from types import SimpleNamespace as N
    >>> act = N(ended=10.0, seconds=2.0, output_ids=[1, 2]); score = N(ended=13.0, seconds=3.0, output_ids=[3])
    >>> node = N(steps=[N(call=act)], rubric_call=None, score_call=score)
    >>> m = timing_metrics([N(seconds=12.0, nodes={"0": node})])
    >>> m["time/tail_max_s"], m["gen/act_tokens"], m["gen/score_tokens"], m["time/tree_max_s"]
    (3.0, 2.0, 1.0, 12.0)
    """
    if not trees:
        return {}
    tails, tokens, calls = [], {"act": 0, "rubric": 0, "score": 0}, {"rubric": 0, "score": 0}
    for t in trees:
        acts = [s.call for n in t.nodes.values() for s in n.steps]
        judged = [c for n in t.nodes.values() for c in (n.rubric_call, n.score_call) if c]
        tokens["act"] += sum(len(c.output_ids) for c in acts)
        for n in t.nodes.values():
            tokens["rubric"] += len(n.rubric_call.output_ids) if n.rubric_call else 0
            tokens["score"] += len(n.score_call.output_ids) if n.score_call else 0
            calls["rubric"] += n.rubric_call is not None
            calls["score"] += n.score_call is not None
        last_act = max((c.ended for c in acts), default=None)
        last_judged = max((c.ended for c in judged), default=None)
        tails.append(max(0.0, last_judged - last_act) if last_act is not None and last_judged else 0.0)
    secs = sorted(float(t.seconds) for t in trees)
    return {
        "time/tree_p50_s": secs[len(secs) // 2],
        "time/tree_max_s": secs[-1],
        "time/tail_mean_s": sum(tails) / len(tails),
        "time/tail_max_s": max(tails),
        **{f"gen/{role}_tokens": float(n) for role, n in tokens.items()},
        **{f"gen/{role}_calls": float(n) for role, n in calls.items()},
    }


def step_metrics(
    *,
    round: int,
    step: int,
    stage: str,
    trees: list[Any],
    batch: Any,
    train: dict[str, float],
    execution_reward: str,
    t_rollout: float,
    t_train: float,
    replaced: int,
    t_round: float | None = None,
    deadline_groups: int = 0,
) -> dict[str, Any]:
    """The metrics line of one rollout round. ``step`` is the policy version the rollouts were sampled
    with (= optimizer steps completed before this round; the stage clock); ``round`` counts every round,
    including rounds without an update. ``t_round``: the round's wall time so far (rollouts, batch,
    training, weight sync), ``time/round_s`` (NaN when the caller does not measure it).
    ``time/scoring_s`` is the WALL time during which a rubric or score call was in flight (concurrent calls
    count once; it lies inside ``time/rollout_s``), not the sum of their durations. ``deadline_groups``: task
    groups dropped (and replaced) because a tree ran past its deadline (``batch/deadline_groups``).
    What learning does, per step: ``grad_norm/<stage>`` (the step's pre-clip norm under its stage's name, so
    the stages' scales can be compared), ``weights/max`` (the largest depth weight of the batch) and
    ``batch/zero_adv_frac`` (the share of trainable datums whose advantage is 0); the trainers add the
    behaviour/trainer ratio (``loss/ratio_mean``, ``loss/ratio_max``, ``loss/abs_log_ratio``). On a GPU every
    tier adds the same memory names (``mem/gpu_peak_gib``, ``mem/gpu_total_gib``, ...:
    :func:`common.run.trainer_memory.gpu_memory_metrics`)."""
    gen_tokens = sum(len(s.call.output_ids) for t in trees for n in t.nodes.values() for s in n.steps)
    trainable = [d for d in batch.datums if d.num_trained_tokens]
    stepped = not train.get("train/skipped") and "grad_norm" in train
    return {
        "round": round,
        "step": step,
        "stage": stage,
        **tree_metrics(trees, execution_reward),
        **train,
        **({f"grad_norm/{stage}": train["grad_norm"]} if stepped else {}),  # one curve per stage
        "weights/max": max(batch.weights, default=0.0),  # the largest depth weight (a lone deep agent)
        "batch/zero_adv_frac": (
            sum(1 for d in trainable if d.advantage == 0) / len(trainable) if trainable else float("nan")
        ),  # share of the trainable datums whose advantage is 0 (no gradient, still in |M|)
        "tokens_per_s": gen_tokens / max(t_rollout, 1e-9),
        "time/rollout_s": t_rollout,
        "time/scoring_s": scoring_seconds(trees),  # wall time with a rubric/score call in flight
        **timing_metrics(trees),  # trees' wall times, the rubric/score tail, tokens by call role
        "time/train_s": t_train,
        "time/round_s": float("nan") if t_round is None else float(t_round),
        "mem/peak_rss_gb": peak_rss_gb(),
        "batch/datums": len(batch.datums),
        "batch/replaced_tasks": replaced,
        "batch/deadline_groups": deadline_groups,
        **{f"batch/{k}": v for k, v in batch.counts.items()},
    }


def staleness_metrics(
    versions: list[int], step: int, stale_groups: int, wait_s: float, first_task: int, end_task: int
) -> dict[str, float]:
    """The metrics of a round rolled out ahead of its training (level 1's ``--max-staleness 1``): the policy
    ``versions`` that sampled its datums (one per datum) against ``step``, the version that trains them.
    ``offpolicy/gap_mean`` and ``offpolicy/gap_max`` are the mean and largest lag (0 = on-policy; level 2
    logs the same names per completion), ``batch/stale_groups`` the task groups dropped for a lag over the
    bound, ``time/rollout_wait_s`` the seconds the trainer waited for the round's rollouts
    (``time/rollout_s`` is their own time, mostly spent while the previous batch trained), ``tasks/first``
    and ``tasks/end`` the sampler's cursor before and after the round's draws (a run's rounds draw
    ``[first, end)`` back to back: none lost or repeated).

    >>> m = staleness_metrics([3, 3, 4], step=4, stale_groups=0, wait_s=0.5, first_task=8, end_task=10)
    >>> round(m["offpolicy/gap_mean"], 3), m["offpolicy/gap_max"], m["offpolicy/datums"], m["tasks/end"]
    (0.667, 1.0, 3.0, 10.0)
    """
    gaps = [step - v for v in versions]
    return {
        "offpolicy/gap_mean": sum(gaps) / len(gaps) if gaps else 0.0,
        "offpolicy/gap_max": float(max(gaps, default=0)),
        "offpolicy/datums": float(len(gaps)),
        "batch/stale_groups": float(stale_groups),
        "time/rollout_wait_s": float(wait_s),
        "tasks/first": float(first_task),
        "tasks/end": float(end_task),
    }


def log_deadline_groups(out: Path, dropped: list[list[Any]], step: int, round: int) -> None:
    """Append the trees of task groups dropped for a deadline to ``out/deadline_trees.jsonl`` (each with
    its ``meta["deadline"]`` reason), so a cut tree is on record, never trained and never lost."""
    from common.agent.log import append_tree

    for trees in dropped:
        for t in trees:
            t.meta.update(step=step, round=round)
            append_tree(Path(out) / "deadline_trees.jsonl", t)


def log_line(m: dict[str, Any]) -> str:
    """The one log line per round, the same in every tier."""
    vals = " ".join(
        f"{k}={m[k]:.4g}" if isinstance(m[k], float) and not math.isnan(m[k]) else f"{k}=nan"
        for k in LOG_KEYS
    )
    skipped = " (no update)" if m.get("train/skipped") else ""
    return f"step={m['step']} stage={m['stage']} {vals}{skipped}"


class RunHistory(list):
    """What a tier's ``train`` returns: the metrics of every round (a list, as before), plus ``stopped``,
    why the run ended before ``--steps`` (None when it reached them). ``sera train`` exits 3 then, so a
    script can tell a run that stopped early from one that finished (0) or failed (1, 2).

    >>> h = RunHistory([{"step": 0}], stopped="3 rounds in a row without an optimizer step")
    >>> len(h), h.stopped, RunHistory().stopped
    (1, '3 rounds in a row without an optimizer step', None)
    """

    def __init__(self, rounds: Any = (), stopped: str | None = None):
        super().__init__(rounds)
        self.stopped = stopped
        """Why the run stopped before --steps (None: it reached them)."""


def closing_line(out: Path, steps: int, rounds: int) -> str:
    """The last line of a run: what it did and where its outputs are (only those that exist).

    >>> import tempfile; d = Path(tempfile.mkdtemp()); _ = (d / "metrics.jsonl").write_text("")
    >>> closing_line(d, 0, 3).replace(str(d), "OUT")
    'done: 0 optimizer steps in 3 rounds. Outputs in OUT/: metrics.jsonl'
    """
    names = {
        "metrics.jsonl": "metrics.jsonl",
        "trees.jsonl": f"trees.jsonl (sera view {out}/trees.jsonl)",
        "curves.png": "curves.png",
        "checkpoints": "checkpoints/",
        "tb": f"tb/ (tensorboard --logdir {out / 'tb'})",
    }
    found = [text for name, text in names.items() if (out / name).exists()]
    return f"done: {steps} optimizer steps in {rounds} rounds. Outputs in {out}/: " + (
        ", ".join(found) or "none"
    )


def _json_safe(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


class MetricsWriter:
    """Appends one strict-JSON line per round to ``out/metrics.jsonl`` (NaN/inf become null) and, with
    ``tensorboard=True``, the numeric values to ``out/tb`` (x axis: ``round``)."""

    def __init__(self, out: Path, tensorboard: bool = False):
        self.path = out / "metrics.jsonl"
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise SystemExit(
                    "--tensorboard needs the tensorboard package: pip install tensorboard"
                ) from None
            self.tb = SummaryWriter(str(out / "tb"))

    def write(self, m: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({k: _json_safe(v) for k, v in m.items()}) + "\n")
        if self.tb is not None:
            for k, v in m.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self.tb.add_scalar(k, v, m["round"])
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Rows of a metrics.jsonl (null read back as NaN)."""
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            rows.append({k: float("nan") if v is None else v for k, v in json.loads(line).items()})
    return rows


def pyplot_or_note(out_png: Path) -> Any:
    """matplotlib's pyplot (Agg backend), or None after one line saying ``out_png`` is not drawn: matplotlib is a
    core dependency, but a bare GPU image may lack it, and a finished run must never fail on its figure."""
    try:
        import matplotlib
    except ImportError:
        print(f"note: matplotlib is not installed, so {out_png} is not drawn", file=sys.stderr)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


TRAINING_CURVES = ("loss/cispo", "grad_norm")
"""Panels that only an optimizer step has a value for: a round without one is a gap there, not a zero."""


def curve_points(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float], list[bool]]:
    """One panel of curves.png: ``(rounds, values, updated)`` for every rollout round that logged ``key``.
    A round without an optimizer step (``train/skipped``) keeps its rollout metrics (drawn hollow) and has no
    training value: NaN, so the line breaks there (its logged 0.0 is a placeholder, not a loss)."""
    xs, ys, updated = [], [], []
    for r in rows:
        y = r.get(key)
        if "round" not in r or not isinstance(y, (int, float)) or isinstance(y, bool):
            continue
        took_step = not r.get("train/skipped")
        if key in TRAINING_CURVES and not took_step:
            y = float("nan")
        elif not math.isfinite(y):
            continue
        xs.append(int(r["round"]))
        ys.append(float(y))
        updated.append(took_step)
    return xs, ys, updated


def plot_curves(metrics_path: Path, out_png: Path) -> list[str]:
    """curves.png: the six fixed metrics against the rollout round, with a legend. A round that took an
    optimizer step is a filled marker, one without an update a hollow marker in the rollout panels and a gap
    in the training panels (loss, grad norm: no step, no value); a panel without any value says so instead
    of drawing empty axes. Returns the legend's labels ([] where matplotlib is missing)."""
    if (plt := pyplot_or_note(out_png)) is None:
        return []
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    rows = read_metrics(metrics_path)
    fig, axes = plt.subplots(2, 3, figsize=(11, 6))
    for ax, k in zip(axes.flat, CURVES, strict=True):
        xs, ys, updated = curve_points(rows, k)
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("rollout round", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if not any(math.isfinite(y) for y in ys):
            why = "no optimizer step yet" if k in TRAINING_CURVES and xs else "no value yet"
            ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="gray")
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        ax.plot(xs, ys, color="C0", lw=1)  # NaN breaks the line: no step, no training value
        for x, y, took in zip(xs, ys, updated, strict=True):
            if math.isfinite(y):
                ax.plot(x, y, "o", ms=4, color="C0", mfc="C0" if took else "white")
    handles = [
        Line2D([], [], color="C0", marker="o", ms=5, lw=1, label="round with an optimizer step"),
        Line2D([], [], color="C0", marker="o", ms=5, mfc="white", lw=0,
               label="round without an update (rollouts only; a gap in loss and grad norm)"),
    ]  # fmt: skip
    legend = fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return [t.get_text() for t in legend.get_texts()]
