#!/usr/bin/env bash
# Issue #37 on one H200: the level-1 run that stopped at round 3 (the 2026-12-04 probe), reproduced with the
# diagnostics of this issue, beside the candidate fix and a run with a deliberately small tree deadline.
#
# Three level-1 runs share the GPU, each with its own vLLM engine (0.22 of the memory, 8 GiB KV cache), all
# the probe's command (shipped warm start, 8 tasks x 8 rollouts, lr 1e-5, RAO, 256 easy tasks, held-out 64
# val tasks every 5 steps) plus vLLM's stats line (--engine-log-stats), the heartbeat and the stuck-call
# dump (RUN/stuck_calls.jsonl):
#   A: the probe's settings (vLLM's asynchronous scheduling on), agent steps cut at 120 s instead of the
#      then-default 300 s (1,800 s since issue #50) so that a stall shows its engine-side state and the
#      run goes on inside one 10-minute GPU job
#   B: the same with --no-async-scheduling (the candidate fix)
#   C: the same with --tree-timeout-s 5 and no held-out evaluation: groups cut by the deadline must be
#      dropped and replaced (batch/deadline_groups, RUN/deadline_trees.jsonl), rounds must go on
# The tree under test is $SNAP (a copy of the project on the GPU machine; see bench/RESULTS.md).
#
# Usage on the GPU machine, with vLLM 0.24 and SmolLM2 installed (docs/gpu_jobs.md), one short job each:
#   bash bench/h200_hang.sh start        # data, then the runs in the background (setsid); RUNS="A C" picks
#                                          runs, A_EXTRA adds options to A, C_TREE_S / C_STEPS set C's deadline
#   bash bench/h200_hang.sh report       # A's trees per round: largest, slowest, refused launches, cut
#   bash bench/h200_hang.sh watch S      # print a summary every 60 s for S seconds, then pack into $OUT (the job's results directory)
#   bash bench/h200_hang.sh stop         # SIGTERM every run (each prints its resume command), pack
set -u
SNAP=${SNAP:-/tmp/keep/snap}
export PYTHONPATH=/tmp/site:$SNAP VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ALLOW_INSECURE_SERIALIZATION=1 \
  SERA_CACHE=/tmp/keep/cache HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
K=/tmp/keep/H; mkdir -p $K
RUNS=${RUNS:-A B C}
common="--level 1 --model smollm2 --engine vllm --tasks-per-step 8 --rollouts-per-task 8 --lr 1e-5 --steps 200 \
 --max-idle-rounds 8 --save-every 5 --max-batch-size 256 --gpu-memory-utilization 0.22 --kv-cache-gib 8 \
 --method rao --difficulty easy --n-tasks 256 --engine-log-stats"
held_out="--eval-tasks $K/val64.jsonl --eval-every 5 --eval-limit 64"

summary() {
  for r in $RUNS; do
    python3 - "$K/$r" "$r" <<'EOF'
import json, sys
from pathlib import Path
d, name = Path(sys.argv[1]), sys.argv[2]
try:
    rows = [json.loads(l) for l in open(d / "metrics.jsonl")]
except Exception:
    print(f"{name}: no metrics yet"); sys.exit()
tr = [r for r in rows if "reward/root_success" in r]
ev = [(r["step"], round(r["eval/success"], 3)) for r in rows if "eval/success" in r]
rs = [r.get("time/round_s", 0) for r in tr]
print(f"{name}: rounds {len(tr)} step {tr[-1]['step'] if tr else None} | round s: "
      + " ".join(f"{x:.0f}" for x in rs[-30:]) + f" | max {max(rs, default=0):.0f}"
      + f" | deadline groups {sum(r.get('batch/deadline_groups', 0) for r in tr)} | eval {ev}")
p = d / "stuck_calls.jsonl"
if p.exists():
    lines = [json.loads(l) for l in open(p)]
    for x in lines[-3:]:
        req = (x.get("engine_requests") or [{}])[0]
        keep = {k: req.get(k) for k in ("request_id", "age_s", "prompt_tokens", "max_tokens", "temperature",
                                        "seed", "stop", "in_engine", "output_tokens", "output_last_ids")}
        print(f"  stuck: {x['reason'][:90]} | {len(x['calls'])} calls, {len(x.get('engine_requests') or [])} "
              f"engine requests | oldest request {keep} | tail {req.get('output_tail', '')[-120:]!r}")
EOF
    grep -h "heartbeat" $K/$r.log 2>/dev/null | tail -2 | cut -c1-330
  done
}

pack() {
  [ -n "${OUT:-}" ] || return
  (cd $K && find . \( -name checkpoints -o -name 'vc?' -o -name evals \) -prune -o -type f -size -6M \
     \( -name 'metrics.jsonl' -o -name 'stuck_calls.jsonl' -o -name '*.log' -o -name 'config.json' \) -print \
     | tar -czf $OUT/H.tgz -T -) && ls -l $OUT
}

case "${1:-watch}" in
start)
  nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
  cd $SNAP
  python3 -m sera data textcraft --split val --n 64 --seed 0 --difficulty easy --out $K/val64.jsonl > $K/data.log 2>&1
  VLLM_CACHE_ROOT=$K/vc1 setsid nohup python3 -m sera train $common $held_out ${A_EXTRA:-} \
     --out $K/A > $K/A.log 2>&1 < /dev/null &
  sleep 40  # the first run converts the GGUF and merges the adapter into the cache; the others reuse them
  for r in $RUNS; do
    case $r in
      B) VLLM_CACHE_ROOT=$K/vc2 setsid nohup python3 -m sera train $common $held_out --step-timeout-s 120 \
           --no-async-scheduling --out $K/B > $K/B.log 2>&1 < /dev/null & ;;
      C) VLLM_CACHE_ROOT=$K/vc3 setsid nohup python3 -m sera train $common --tree-timeout-s ${C_TREE_S:-5} \
           --steps ${C_STEPS:-8} --out $K/C > $K/C.log 2>&1 < /dev/null & ;;
    esac
  done
  cd - > /dev/null
  ;;
report)  # per round of A: the largest tree, launches refused by the bounds, the slowest tree, deadlines
  python3 - $K/A/trees.jsonl <<'EOF'
import collections, json, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    t = json.loads(line); m = t.get("meta", {}); n = t["nodes"]
    launches = sum(len(s.get("launched", [])) for x in n.values() for s in x["steps"])
    rows[m.get("round")].append((len(n), round(t["seconds"], 1), launches, m.get("refused_by_bound", 0),
                                 m.get("deadline"), t["task_id"]))
for r in sorted(rows):
    v = rows[r]
    print(f"round {r}: {len(v)} trees, max nodes {max(v)[0]}, slowest {max(x[1] for x in v)} s, launches "
          f"{sum(x[2] for x in v)}, refused by bound {sum(x[3] for x in v)}, cut {sum(bool(x[4]) for x in v)}; "
          f"largest {max(v)}")
EOF
  grep -h "heartbeat" $K/A.log | head -6 | cut -c1-400
  ;;
watch)
  S=${2:-500}; T0=$(date +%s)
  while [ $(( $(date +%s) - T0 )) -lt "$S" ]; do
    sleep 60; echo "--- $(( $(date +%s) - T0 )) s"; summary 2>&1 | cut -c1-900
  done
  for r in $RUNS; do echo "== $r.log"; grep -v "loggers.py\|WARNING\|INFO" $K/$r.log | tail -3 | cut -c1-300; done
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
  pack
  ;;
stop)
  pkill -TERM -f "sera train" ; sleep 15
  for r in $RUNS; do echo "== $r.log"; tail -3 $K/$r.log | cut -c1-300; done
  summary 2>&1 | cut -c1-900; pack
  ;;
esac
