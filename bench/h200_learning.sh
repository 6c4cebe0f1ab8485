#!/usr/bin/env bash
# Issues #39 and #51 on one GPU (H100 or H200) across short time-limited GPU jobs on a machine that stays up between them
# (docs/gpu_jobs.md): bench/tiny_set.sh (the tiny-set check) and bench/learning.sh (SERA vs RAO from the
# shipped warm start) run in the BACKGROUND (setsid) side by side, so their vLLM engines start once and keep
# running while one short job after another watches them. Every run's command is those scripts'; this file
# only starts, watches and packs them.
#
# The job plan (vLLM 0.24, SmolLM2 and peft installed, docs/gpu_jobs.md; never pipe a job's command into
# `tail`: a job stopped at its limit loses the whole pipeline's output):
#   bash bench/h200_learning.sh start                 # snapshot this tree, start the comparison (TINY=1: and the tiny set); ~10 s
#   bash bench/h200_learning.sh watch 540             # a summary every 60 s, then pack into $OUT, the job's results directory (one job each)
#   bash bench/h200_learning.sh stop-tiny             # stop the tiny set (e.g. to give the card to the rest)
#   PY=.venv/bin/python bash bench/h200_learning.sh import L.tgz bench/runs/learning_DATE   # back here: unpack, redraw
#   SEEDS=0 bash bench/h200_learning.sh start         # a short window: one seed's SERA and RAO (the next window SEEDS=1,
#                                                       imported into the same DIR: seeds pool there, nothing to carry)
#   bash bench/h200_learning.sh ckpt [RUN...]         # after the last watch, a job of its own (repeat while it names runs
#                                                       left): checkpoints over one file (a rank-16 run's ~59 MB with
#                                                       its AdamW state) into $OUT in 16-MB parts + .sha256
#   CMP_STEPS=40 bash bench/h200_learning.sh resume DIR bench/runs/learning_DATE   # a later machine: the carried
#                                                       checkpoints (rl_<method>_s<seed>_step_NNNNNN.pt, or its parts)
#                                                       and the imported logs in place; every run continues to step 40
# Knobs: TINY_VARIANTS (tiny_set.sh's VARIANTS), TINY_STEPS, TINY (0: no tiny set; the default with WITH=cmp), CMP (the
# comparison's extra flags; default the recipe that fit the tiny set on 2026-12-07: --lora-rank 16 --lr 3e-4 --temperature 0.7;
# its checkpoints, ~59 MB with the AdamW state, come back in parts: `ckpt`, then `resume` in the next window),
# CMP_STEPS [20: one SERA cycle 16:2:2; evaluated at step 0 and the last step: learning.sh's EVAL_EVERY default], CMP_TIME_LIMIT
# [1100: `sera train --time-limit-s`, so a run the window cannot finish stops at a step and is evaluated there], SEEDS,
# N_EVAL, EVAL_SAMPLES; K (where runs live, default /tmp/keep/L), SNAP (the tree the runs use).
# WITH=warmstart (issue #51.2-3, one window): instead of the comparison, bench/h200_warmstart_call.sh runs
# beside the tiny set: the warm start re-made on today's prompts (WS_TASKS oracle trees, WS_STEPS SFT steps),
# then evaluated on all N_EVAL=147 easy val tasks greedy and at 2 sampling seeds, the shipped adapter
# evaluated the same way beside the SFT (SHIPPED_BESIDE), each evaluation's vLLM engine with a 4-GiB KV
# cache; the tiny-set runs are sized to the card less WS_GIB [20] GiB kept for the SFT and one evaluation.
# SFT_EXTRA, SFT_DATA and COMMIT reach it (see its header: e.g. --dtype bfloat16, oracle data built elsewhere;
# COMMIT=$(git rev-parse HEAD) typed here, since the GPU job's copy of the tree has no .git: its record says so).
# `watch` packs the warm start's record and (once trained) its adapter into $OUT/$NAME as well.
#   WITH=warmstart bash bench/h200_learning.sh start; WITH=warmstart bash bench/h200_learning.sh watch 540
# WITH=tiny: the tiny set alone (its variants as many at once as fit the card).
# CPU dry run of the same flow (tiny model, hf engine, 1-2 steps, no GPU):
#   DRY=1 K=/tmp/dryL SNAP=/tmp/dry_snap PY=$PWD/.venv/bin/python bash bench/h200_learning.sh start
#   DRY=1 K=/tmp/dryL SNAP=/tmp/dry_snap PY=$PWD/.venv/bin/python OUT=/tmp/o bash bench/h200_learning.sh watch 120
#   (add WITH=warmstart to both for the warm-start flow)
set -u
WITH=${WITH:-cmp}; case "$WITH" in cmp|warmstart|tiny) ;; *) echo "WITH must be cmp, warmstart or tiny, got '$WITH'" >&2; exit 2 ;; esac
if [ "$WITH" = cmp ]; then TINY=${TINY:-0}; else TINY=${TINY:-1}; fi  # the tiny set beside the comparison only when asked
K=${K:-/tmp/keep/L}; mkdir -p "$K"
SNAP=${SNAP:-/tmp/keep/snap39}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
if [ "${DRY:-0}" = 1 ]; then  # CPU: tiny model, hf engine, a step or two
  export MODEL=tiny ENGINE=hf TASKS_PER_STEP=2 ROLLOUTS=2 N_TASKS=8 N_EVAL=2 EVAL_SAMPLES=${EVAL_SAMPLES:-2} \
    AGENT="--max-steps 2 --max-new-tokens 12" CALLS="--rubric-max-new-tokens 16 --score-max-new-tokens 16" \
    RL_EXTRA="--codeact-executor worker-ordered --oracle-mix 0.7 --score-noise 0.3"
  TINY_STEPS=${TINY_STEPS:-2}; CMP_STEPS=${CMP_STEPS:-2}; SEEDS=${SEEDS:-0}
  CMP_SCHEDULE=${CMP_SCHEDULE:-execution:1,delegation:1,rubric:1}
  TINY_VARIANTS=${TINY_VARIANTS:-"full:--lr 1e-3|lora:--lora-rank 4 --lr 1e-2"}
  CMP=${CMP:-"--lora-rank 4 --lr 1e-2"}
  WS_TASKS=${WS_TASKS:-2}; WS_STEPS=${WS_STEPS:-2}
  WS_ENV=${WS_ENV:-"FORCE=1 SHIPPED=none"}  # no shipped adapter for the tiny model: the base model stands in
else
  export PYTHONPATH=/tmp/site:$SNAP VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ALLOW_INSECURE_SERIALIZATION=1 \
    SERA_CACHE=/tmp/keep/cache HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 ENGINE=vllm PARALLEL=1
  TINY_STEPS=${TINY_STEPS:-60}; CMP_STEPS=${CMP_STEPS:-20}; SEEDS=${SEEDS:-"0 1"}
  T07="--temperature 0.7"  # the four recipes of 2026-12-07 (bench/runs/tiny_set_2026-12-07); the first one won
  TINY_VARIANTS=${TINY_VARIANTS:-"lora16_3e-4_t07:--lora-rank 16 --lr 3e-4 $T07|lora16_1e-3_t07:--lora-rank 16 --lr 1e-3 $T07|lora16_3e-4_t07_k16:--lora-rank 16 --lr 3e-4 $T07 --rollouts-per-task 16|full_3e-5_clip_t07:--lr 3e-5 --grad-clip 0.05 $T07"}
  CMP=${CMP:-"--lora-rank 16 --lr 3e-4 $T07"}
  CMP_TIME_LIMIT=${CMP_TIME_LIMIT-1100}  # seconds of rounds; the last evaluation and the start-up come on top
  WS_ENV=${WS_ENV:-}
  export KV_GIB=${KV_GIB:-4}  # each run: --gpu-share from bench/gpu_fit.py (as many at once as fit the card)
fi
NAME=${NAME:-${MODEL:-smollm2}-textcraft}  # the warm start's adapter name (WITH=warmstart)

start() {  # both drivers in the background, each in its own session (they outlive this job)
  rm -rf "$SNAP" && mkdir -p "$SNAP" \
    && tar --exclude=./.whl --exclude=./runs --exclude=./.git --exclude=./.venv -cf - . | (cd "$SNAP" && tar -xf -)
  reserved=""  # with the warm start beside it: the tiny set sized to the card less WS_GIB (bench/gpu_fit.py)
  [ "$WITH" = warmstart ] && [ "${DRY:-0}" != 1 ] && reserved=${WS_GIB:-20}
  [ "$TINY" = 0 ] || (cd "$SNAP" || exit 2; VARIANTS="$TINY_VARIANTS" STEPS="$TINY_STEPS" PYTHON="$PY" GPU_RESERVED_GIB="$reserved" \
     setsid nohup bash bench/tiny_set.sh "$K/tiny" > "$K/tiny.log" 2>&1 < /dev/null & echo $! > "$K/tiny.pid")
  [ "$WITH" = tiny ] && { sleep 5; tail -n 3 "$K/tiny.log"; return; }  # the tiny set alone
  if [ "$WITH" = warmstart ]; then warmstart; sleep 5; tail -n 3 "$K"/tiny.log "$K/warmstart.log" 2>/dev/null; return; fi
  mkdir -p "$K/cmp"; [ -f "$K/cmp/window.txt" ] || date -u +%Y-%m-%dT%H:%M:%SZ > "$K/cmp/window.txt"  # names this window's logs
  (cd "$SNAP" && SEEDS="$SEEDS" RL_STEPS="$CMP_STEPS" SCHEDULE="${CMP_SCHEDULE:-execution:16,delegation:2,rubric:2}" RL_EXTRA="${RL_EXTRA:-} $CMP --save-every 5 ${CMP_TIME_LIMIT:+--time-limit-s $CMP_TIME_LIMIT}" PYTHON="$PY" \
     setsid nohup bash bench/learning.sh "$K/cmp" > "$K/cmp.log" 2>&1 < /dev/null &)
  sleep 5; tail -n 3 "$K"/tiny.log "$K/cmp.log" 2>/dev/null
}

ws() {  # bench/h200_warmstart_call.sh with this window's settings (#51.2): extra environment, then its arguments
  (cd "$SNAP" && env RUN="$K/warmstart" NAME="$NAME" PYTHON="$PY" TASKS="${WS_TASKS:-256}" STEPS="${WS_STEPS:-260}" \
     QUICKSTART=0 N_EVAL="${N_EVAL:-147}" EVAL_BATCH="${N_EVAL:-147}" SAMPLED_SEEDS="0 1" COMPARE_SHIPPED=1 \
     SHIPPED_BESIDE=1 EVAL_BASE=0 EVAL_PARALLEL=1 EVAL_EXTRA="$([ "${DRY:-0}" = 1 ] || echo --kv-cache-gib 4)" \
     SFT_EXTRA="${SFT_EXTRA:-}" SFT_DATA="${SFT_DATA:-}" COMMIT="${COMMIT:-}" $WS_ENV "$@")
}

warmstart() {  # the warm start in the background, in its own session (it outlives this job)
  ws setsid nohup bash bench/h200_warmstart_call.sh > "$K/warmstart.log" 2>&1 < /dev/null &
}

summary() {  # each run's last rounds, the drivers' own tables
  $PY - "$K" <<'EOF'
import json, sys
from pathlib import Path
K = Path(sys.argv[1])
for m in sorted(K.glob("**/metrics.jsonl")):
    rows = [json.loads(x) for x in m.read_text().splitlines() if x.strip()]
    tr = [r for r in rows if "reward/root_success" in r]
    if not tr and rows and "loss/sft" in rows[-1]:  # the warm start's SFT (WITH=warmstart)
        print(f"{m.parent.relative_to(K)}: SFT step {rows[-1].get('step')} loss {rows[-1]['loss/sft']:.4f}")
        continue
    ev = [(r["step"], round(r["eval/success"], 3), round(r.get("eval/sampled_success", float("nan")), 3))
          for r in rows if "eval/success" in r]
    rs = [r["reward/root_success"] for r in tr]
    roll = [sum(rs[max(0, i - 4): i + 1]) / len(rs[max(0, i - 4): i + 1]) for i in range(len(rs))]
    t = [r.get("time/round_s") or 0 for r in tr]
    last = tr[-1] if tr else {}
    print(f"{m.parent.relative_to(K)}: rounds {len(tr)} step {last.get('step')} | root success (rolling 5) "
          + " ".join(f"{x:.2f}" for x in roll[-10:]) + f" | best {max(roll, default=0):.2f}"
          + f" | round s {sum(t[-5:]) / max(1, len(t[-5:])):.0f} | |log rho| {last.get('loss/abs_log_ratio', 0):.3g}"
          + f" | eval (step, greedy, sampled) {ev}")
EOF
  [ -f "$K/warmstart/times.txt" ] && tail -n 4 "$K/warmstart/times.txt"
  for f in "$K"/*.log "$K"/*/*.log; do  # a run that failed: its last lines
    [ -f "$f" ] && grep -q -E "Traceback|Error|^error:|rc=[12]" "$f" && { echo "== $f"; grep -E "Error|error:|rc=" "$f" | tail -n 3 | cut -c1-300; }
  done
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>/dev/null || true
}

all_done() {  # every driver this window started wrote its last line (a driver not started counts as done)
  [ -f "$K/cmp.log" ] && ! grep -q "job finished" "$K/cmp.log" && return 1
  [ -f "$K/tiny.log" ] && ! grep -q "job finished" "$K/tiny.log" && return 1
  [ -d "$K/warmstart" ] && ! grep -q "all done" "$K/warmstart/times.txt" 2>/dev/null && return 1
  return 0
}

pack() {  # metrics, configs, logs, reports, slim per-task results (no trees) in one tgz; the comparison's checkpoints
  [ -n "${OUT:-}" ] || return 0; mkdir -p "$OUT"
  rm -rf "$K.slim" && mkdir -p "$K.slim"
  $PY - "$K" "$K.slim" <<'EOF'
import json, shutil, sys
from pathlib import Path
K, S = Path(sys.argv[1]), Path(sys.argv[2])
keep = ("index", "task_id", "tier", "success", "error", "nodes", "seconds")
for f in K.rglob("*"):
    if not f.is_file() or {"checkpoints", "vllm_cache", "model", "adapter", "out"} & set(f.relative_to(K).parts) \
            or f.name == "sft_data.jsonl":
        continue
    to = S / f.relative_to(K)
    to.parent.mkdir(parents=True, exist_ok=True)
    if f.name == "trees.jsonl":  # a rollout's task, outcome and round, not its tree (plot_learning.tasks_by_round)
        with open(f) as src, open(to, "w") as dst:
            for line in src:
                try:
                    t = json.loads(line)
                except ValueError:  # a line cut by a kill mid-write
                    continue
                meta = {k: (t.get("meta") or {}).get(k) for k in ("round", "step")}
                dst.write(json.dumps({"task_id": t.get("task_id"), "success": t.get("success"), "meta": meta}) + "\n")
    elif f.parent.name == "results" and f.suffix == ".json":  # one eval task: its outcome, not its tree
        r = json.loads(f.read_text())
        to.write_text(json.dumps({k: r.get(k) for k in keep}))
    elif f.suffix in (".jsonl", ".json", ".log", ".txt", ".md", ".png") and f.stat().st_size < 8_000_000:
        shutil.copy(f, to)
EOF
  (cd "$K.slim" && tar -czf "$OUT/L.tgz" .)
  if [ -d "$K/warmstart" ]; then  # its record so far and, once trained, the adapter: $OUT/$NAME (no phase runs)
    ws BUDGET_S=0 OUT="$OUT" bash bench/h200_warmstart_call.sh > "$K/warmstart_pack.log" 2>&1
    tail -n 4 "$K/warmstart/times.txt" 2>/dev/null; cat "$K/warmstart/record.log" 2>/dev/null
  fi
  for d in "$K"/cmp/rl_*/s*; do  # a checkpoint that fits one file comes back with every pack (16 MiB a file)
    last=$(ls -d "$d"/checkpoints/step_* 2>/dev/null | sort | tail -n 1)
    [ -n "$last" ] || continue
    name=$(echo "${d#"$K"/cmp/}" | tr / _)_$(basename "$last").pt
    if [ "$(stat -c %s "$last/state.pt")" -lt "$PART_BYTES" ]; then cp "$last/state.pt" "$OUT/$name"
    else echo "$last: over one file; \`ckpt ${d#"$K"/cmp/}\` hands it back in parts, a job of its own"; fi
  done
  ls -l "$OUT"
}

PART_BYTES=${PART_BYTES:-16000000}  # the largest file a job hands back (16 MiB, with a margin)
ckpt() {  # ckpt RUN...: each run's last checkpoint into $OUT in parts (NAME.pt.part.aa, ...) + NAME.pt.sha256,
  # as many runs as fit one job's return (8 files, 64 MiB); the rest are named for the next job
  [ -n "${OUT:-}" ] || { echo "ckpt: OUT must name the job's results folder"; return 2; }
  mkdir -p "$OUT"; local files bytes r last name size n left=""
  files=$(find "$OUT" -maxdepth 1 -type f | wc -l); bytes=$(du -cb "$OUT" | tail -n 1 | cut -f1)
  for r in "$@"; do
    last=$(ls -d "$K/cmp/$r"/checkpoints/step_* 2>/dev/null | sort | tail -n 1)
    [ -n "$last" ] || { echo "$r: no checkpoint in $K/cmp/$r"; continue; }
    size=$(stat -c %s "$last/state.pt"); n=$(( (size + PART_BYTES - 1) / PART_BYTES ))
    if [ $((files + n + 1)) -gt 8 ] || [ $((bytes + size)) -gt 66000000 ]; then left="$left $r"; continue; fi
    name=$(echo "$r" | tr / _)_$(basename "$last").pt
    split -b "$PART_BYTES" "$last/state.pt" "$OUT/$name.part."
    (cd "$last" && sha256sum state.pt) | sed "s/state.pt\$/$name/" > "$OUT/$name.sha256"
    files=$((files + n + 1)); bytes=$((bytes + size)); echo "$r: $(basename "$last") in $n part(s), $size bytes"
  done
  [ -z "$left" ] || echo "left for the next job (this one's return is full):$left"
  ls -l "$OUT"
}

place() {  # place DIR [LOGS]: carried checkpoints (whole .pt, or .pt.part.* joined and checked against .pt.sha256)
  # into $K/cmp/rl_<method>/s<seed>/checkpoints/step_N/state.pt; with LOGS (the window's import directory, e.g.
  # bench/runs/learning_DATE: it travels with the tree), each run's metrics.jsonl and trees.jsonl too, so the
  # resumed run keeps one log (sera train --resume truncates them to the checkpoint)
  local dir=${1:?place DIR [LOGS]} logs=${2:-} a f b m s step
  for a in "$dir"/rl_*_s*_step_*.pt.part.aa; do
    [ -e "$a" ] || continue
    f=${a%.part.aa}; cat "$f".part.* > "$f"
    if [ -f "$f.sha256" ]; then (cd "$(dirname "$f")" && sha256sum -c --quiet "$(basename "$f").sha256") \
      || { echo "$f: a part is missing or damaged"; rm -f "$f"; return 2; }
    else echo "$f: joined without a .sha256 to check it against"; fi
  done
  for f in "$dir"/rl_*_s*_step_*.pt; do
    [ -e "$f" ] || continue
    b=$(basename "$f" .pt); m=$(echo "$b" | cut -d_ -f2); s=$(echo "$b" | cut -d_ -f3)
    step=$(echo "$b" | sed 's/.*_step_//'); mkdir -p "$K/cmp/rl_$m/$s/checkpoints/step_$step"
    cp "$f" "$K/cmp/rl_$m/$s/checkpoints/step_$step/state.pt"
    if [ -n "$logs" ]; then
      for l in metrics.jsonl trees.jsonl; do
        # never over a log the run already has here (this machine ran it): only a fresh machine gets them
        [ -f "$logs/rl_$m/$s/$l" ] && [ ! -e "$K/cmp/rl_$m/$s/$l" ] && cp "$logs/rl_$m/$s/$l" "$K/cmp/rl_$m/$s/$l"
      done
    fi
    echo "rl_$m/$s: step_$step in place$([ -n "$logs" ] && echo ", its logs from $logs")"
  done
}

case "${1:-watch}" in
start) start ;;
resume)  # a later window: carried checkpoints (and the imported logs) in place, then start: every run resumes
  place "${2:?usage: resume DIR [LOGS]}" "${3:-}" && start ;;
place) place "${2:?usage: place DIR [LOGS]}" "${3:-}" ;;
ckpt)  # a job of its own after the last watch: checkpoints too big for one file, in parts
  shift; [ $# -gt 0 ] || set -- $(cd "$K/cmp" 2>/dev/null && ls -d rl_*/s* 2>/dev/null)
  ckpt "$@" ;;
watch)  # ends early once every driver started here has finished (device time is counted while held)
  S=${2:-540}; T0=$(date +%s)
  while [ $(( $(date +%s) - T0 + 75 )) -le "$S" ]; do
    for _ in 1 2 3 4; do sleep 15; all_done && break; done  # a summary a minute; the end seen within 15 s
    echo "--- $(( $(date +%s) - T0 )) s"; summary
    all_done && { echo "--- every driver has finished"; break; }
  done
  summary; pack ;;
import)  # here, after the window: the L.tgz a `watch` packed -> DIR, its reports redrawn (plot_learning, plot_tiny_set)
  T=${2:?usage: import L.tgz DIR}; D=${3:?usage: import L.tgz DIR}; X=$(mktemp -d)
  tar -xzf "$T" -C "$X" || exit 2
  mkdir -p "$D"
  # the comparison's driver log and times, one section per GPU window (cmp/window.txt, written at `start`): a window
  # not imported yet (the other seed, or a continuation from carried checkpoints) is appended, a later pack of
  # one already there replaces its own section; a pack without a window name counts as one window, "unnamed"
  if [ -d "$X/cmp" ]; then
    w=$(cat "$X/cmp/window.txt" 2>/dev/null || echo unnamed); rm -f "$X/cmp/window.txt"
    for f in "$X/cmp.log" "$X/cmp/times.txt"; do
      [ -f "$f" ] || continue
      $PY - "$D/$(basename "$f")" "$f" "$w" "$(basename "$T")" <<'EOF'
import re, sys
from pathlib import Path
dst, src, window, label = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
head = re.compile(r"^=== window (\S+) \(import of .*\) ===$", re.M)
text = dst.read_text() if dst.is_file() else ""
cuts = [m.start() for m in head.finditer(text)] + [len(text)]
parts = [text[: cuts[0]]] + [text[a:b] for a, b in zip(cuts, cuts[1:])]  # the text before any header, then sections
new = f"=== window {window} (import of {label}) ===\n" + src.read_text()
hit = [i for i, t in enumerate(parts) if (m := head.match(t)) and m.group(1) == window]
if hit:
    parts[hit[0]] = new
else:
    parts.append(new if not parts[-1] or parts[-1].endswith("\n") else "\n" + new)
dst.write_text("".join(parts))
EOF
      rm -f "$f"
    done
  fi
  cp "$X"/*.log "$D/" 2>/dev/null  # the drivers' own logs
  tiny="$D"; [ -d "$X/cmp" ] && tiny="$D/tiny_set"  # the comparison in DIR, a tiny set beside it in DIR/tiny_set
  if [ -d "$X/cmp" ]; then  # each evaluation's per-task files folded into one results.jsonl (24 x 147 files otherwise)
    cp -r "$X/cmp/." "$D/" && $PY -c "import sys; from pathlib import Path; from common.eval import archive_results
for d in sys.argv[1:]: archive_results(Path(d))" "$D"/rl_*/s*/evals/step_* \
    && $PY bench/plot_learning.py "$D" > "$D/plot.log" 2>&1; echo "$D/learning.md (rc $?)"; fi
  if [ -d "$X/tiny" ]; then mkdir -p "$tiny" && cp -r "$X/tiny/." "$tiny/" \
    && $PY bench/plot_tiny_set.py "$tiny" --target 0.5 --window 5 > "$tiny/plot.log" 2>&1; echo "$tiny/tiny_set.md (rc $?)"; fi
  [ -d "$X/warmstart" ] && cp -r "$X/warmstart" "$D/" && echo "$D/warmstart"
  rm -rf "$X" ;;
stop-tiny)  # the tiny set's whole session (its runs resume from their last checkpoint on the next start)
  kill -TERM -- "-$(cat "$K/tiny.pid")" && echo "stopped the tiny set (session $(cat "$K/tiny.pid"))" ;;
*) echo "usage: $0 start | watch S | ckpt [RUN...] | place DIR [LOGS] | resume DIR [LOGS] | stop-tiny | import L.tgz DIR" >&2; exit 2 ;;
esac
