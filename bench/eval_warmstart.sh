#!/usr/bin/env bash
# The shipped warm start's held-out success at a chosen sampling temperature, one GPU job (issue #51.2: its
# sampled rate at the RL recipe's rollout temperature 0.7, beside the 9.2 % measured at the quick start's 1.0).
# The same `sera eval` command as bench/h200_warmstart_call.sh's shipped evaluations (the quick start's agent
# sizes from `sera train --print-config`, the first N easy val tasks, every task in flight), with
# --temperature TEMP, one evaluation per seed, one after another (the first converts SmolLM2 into SERA_CACHE).
#
#   TEMP=0.7 SEEDS="0 1" N_EVAL=147 OUT=<results dir> bash bench/eval_warmstart.sh      # GPU (vLLM 0.24 there)
#   ENGINE=hf MODEL=tiny INIT=none N_EVAL=2 TEMP=0.7 SEEDS=0 PY=.venv/bin/python OUT=/tmp/ew bash bench/eval_warmstart.sh
#                                                                                        # CPU dry run
# Results in OUT: ew.tgz (each evaluation's report.json, per-task outcomes without trees, and log) and summary.txt.
set -u
root=$(git rev-parse --show-toplevel 2>/dev/null || pwd); cd "$root"
PY=${PY:-python3}; ENGINE=${ENGINE:-vllm}; MODEL=${MODEL:-smollm2}; INIT=${INIT:-auto}
TEMP=${TEMP:-0.7}; SEEDS=${SEEDS:-"0 1"}; N_EVAL=${N_EVAL:-147}; OUT=${OUT:?OUT: the results directory}
RUN=${RUN:-/tmp/keep/ew}; mkdir -p "$RUN" "$OUT"
if [ "$ENGINE" = vllm ]; then
  export PYTHONPATH=/tmp/site:$root SERA_CACHE=${SERA_CACHE:-/tmp/keep/cache} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_WORKER_MULTIPROC_METHOD=spawn
  KV="--kv-cache-gib ${KV_GIB:-8}"
else KV=""; fi
export PYTHONUNBUFFERED=1
AGENT=$($PY -m sera train --print-config | $PY -c "import json, sys; r = json.load(sys.stdin)['rollout']
print(' '.join(f'--{n.replace(\"_\", \"-\")} {r[n]}' for n in ('max_steps', 'max_depth', 'max_new_tokens')))") \
  || { echo "could not read the quick start's agent sizes"; exit 2; }
$PY -m sera data textcraft --split val --n "$N_EVAL" --seed 0 --difficulty easy --out "$RUN/val_easy.jsonl" > "$RUN/data.log" 2>&1 \
  || { cat "$RUN/data.log"; exit 2; }
T0=$(date +%s)
for s in $SEEDS; do
  d="$RUN/t${TEMP}_s$s"
  echo "[$(( $(date +%s) - T0 )) s] eval seed $s: $AGENT --temperature $TEMP" | tee -a "$OUT/summary.txt"
  $PY -m sera eval --env textcraft --tasks "$RUN/val_easy.jsonl" --limit "$N_EVAL" --concurrency "$N_EVAL" \
    --batch-size "$N_EVAL" --engine "$ENGINE" $AGENT --policy "hf:$MODEL" --init-adapter "$INIT" $KV \
    --temperature "$TEMP" --seed "$s" --out "$d" > "$d.log" 2>&1
  echo "[$(( $(date +%s) - T0 )) s] rc $?: $($PY -c "import json; r = json.load(open('$d/report.json'))
print(f\"{r['successes']}/{r['n_tasks']} = {100 * r['success_rate']:.1f} %\")" 2>&1)" | tee -a "$OUT/summary.txt"
done
$PY - "$RUN" <<'EOF'  # one line per task and seed (no trees), beside the reports
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
for d in sorted(run.glob("t*_s*")):
    if d.is_dir():
        rows = [json.loads(f.read_text()) for f in sorted((d / "results").glob("*.json"))]
        keep = ("index", "task_id", "success", "error", "seconds")
        (d / "outcomes.jsonl").write_text("".join(json.dumps({k: r.get(k) for k in keep}) + "\n" for r in rows))
EOF
(cd "$RUN" && tar -czf "$OUT/ew.tgz" --exclude='*/results' --exclude='*/trees*' .)
ls -l "$OUT"; cat "$OUT/summary.txt"
