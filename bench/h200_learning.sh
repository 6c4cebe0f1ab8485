#!/usr/bin/env bash
# Issue #39 on one H200: the tiny-set check and the start of the SERA-vs-RAO comparison, side by side, in the
# background across 10-minute device calls (the machine stays warm between back-to-back calls).
#
# Every run: level 1, SmolLM2-135M + the shipped warm-start adapter, vLLM engine, the paper's batch (8 tasks x 8
# rollouts), quick-start agent sizes (3 steps, 256-token replies). Runs share the GPU, each with its own engine
# (GPU_MEM of the memory, KV_GIB of KV cache) and vLLM compile cache.
#   tiny/<variant>  RAO on 8 fixed train tasks (the "overfit a tiny set" check: training root success, sampled,
#                   must reach 0.5 within 60 optimizer steps); VARIANTS = "name:flags|name:flags|..."
#   rl_sera/s<seed>, rl_rao/s<seed>  the comparison: 256 easy train tasks, held-out VAL easy val tasks greedy +
#                   EVAL_SAMPLES sampled at step 0, every EVAL_EVERY and at step CMP_STEPS (a later window may raise
#                   CMP_STEPS and resume: the run's other settings must stay); SERA with the paper's 16:2:2 schedule;
#                   CMP_FLAGS (default LoRA rank 4, lr 1e-4: its checkpoint, adapter + AdamW state, ~15 MB, can
#                   leave the machine and continue in a later window: `pack` puts the newest in $OUT)
#
# Usage on the device, after the bundle's transfer calls (../shared/gpu/device-vllm-steps.md):
#   bash bench/h200_learning.sh start       # snapshot this tree, data, every run in the background (setsid)
#   bash bench/h200_learning.sh watch S     # a summary every 60 s for S seconds, then pack into $OUT
#   bash bench/h200_learning.sh resume DIR  # comparison runs: continue from checkpoints carried in DIR
#   bash bench/h200_learning.sh stop        # SIGTERM every run (each saves nothing new: checkpoints are per
#                                             SAVE_EVERY steps), then pack
# CPU dry run of the same flow (tiny model, hf engine, 2 steps): DRY=1 bash bench/h200_learning.sh start; then
#   DRY=1 bash bench/h200_learning.sh watch 120
set -u
K=${K:-/tmp/keep/L}; mkdir -p "$K"
SNAP=${SNAP:-/tmp/keep/snap39}
if [ "${DRY:-0}" = 1 ]; then  # CPU: the tiny model, the hf engine, two steps, a few tasks
  BASE="--level 1 --model tiny --init-adapter none --engine hf --tasks-per-step 2 --rollouts-per-task 2 \
 --max-new-tokens 16 --rubric-max-new-tokens 16 --score-max-new-tokens 16 --oracle-mix 0.5 --max-idle-rounds 6"
  TINY_STEPS=${TINY_STEPS:-2}; CMP_STEPS=${CMP_STEPS:-2}; EVAL_EVERY=${EVAL_EVERY:-2}; VAL=${VAL:-4}; PY=${PY:-python3}
  VARIANTS=${VARIANTS:-"full:--lr 1e-5|lora:--lora-rank 4 --lr 1e-4"}
  SEEDS=${SEEDS:-0}
else
  BASE="--level 1 --model smollm2 --engine vllm --tasks-per-step 8 --rollouts-per-task 8 --max-idle-rounds 20 \
 --max-batch-size 256 --gpu-memory-utilization ${GPU_MEM:-0.12} --kv-cache-gib ${KV_GIB:-6}"
  TINY_STEPS=${TINY_STEPS:-60}; CMP_STEPS=${CMP_STEPS:-40}; EVAL_EVERY=${EVAL_EVERY:-40}; VAL=${VAL:-256}; PY=${PY:-python3}
  VARIANTS=${VARIANTS:-"full_clip:--lr 1e-5 --grad-clip 0.05|lora4_1e-4:--lora-rank 4 --lr 1e-4|lora4_3e-4:--lora-rank 4 --lr 3e-4"}
  SEEDS=${SEEDS:-0}
  export PYTHONPATH=/tmp/site:$SNAP VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ALLOW_INSECURE_SERIALIZATION=1 \
    SERA_CACHE=/tmp/keep/cache HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
fi
export PYTHONUNBUFFERED=1
CMP_FLAGS=${CMP_FLAGS:-"--lora-rank 4 --lr 1e-4"}
EVAL_SAMPLES=${EVAL_SAMPLES:-2}
SAVE_EVERY=${SAVE_EVERY:-5}
METHODS=${METHODS:-"sera rao"}

run() {  # run NAME_DIR FLAGS...: one training run in the background, in its own session (survives the call)
  local dir=$1; shift
  mkdir -p "$K/$dir"
  (cd "$SNAP" && VLLM_CACHE_ROOT="$K/vc/${dir//\//_}" setsid nohup $PY -m sera train $BASE "$@" --out "$K/$dir" \
     > "$K/$dir.log" 2>&1 < /dev/null &)
}

cmp_flags() {  # cmp_flags METHOD SEED
  local extra=""
  [ "$1" = sera ] && extra="--schedule execution:16,delegation:2,rubric:2"
  echo "--method $1 $extra --seed $2 --difficulty easy --n-tasks 256 --steps $CMP_STEPS --save-every $SAVE_EVERY \
 --eval-tasks $K/val.jsonl --eval-every $EVAL_EVERY --eval-limit $VAL --eval-samples $EVAL_SAMPLES $CMP_FLAGS"
}

summary() {
  $PY - "$K" <<'EOF'
import json, sys
from pathlib import Path
K = Path(sys.argv[1])
for m in sorted(K.glob("**/metrics.jsonl")):
    rows = [json.loads(x) for x in m.read_text().splitlines() if x.strip()]
    tr = [r for r in rows if "reward/root_success" in r]
    ev = [(r["step"], round(r["eval/success"], 3), round(r.get("eval/sampled_success", float("nan")), 3))
          for r in rows if "eval/success" in r]
    rs = [r["reward/root_success"] for r in tr]
    roll = [sum(rs[max(0, i - 4): i + 1]) / len(rs[max(0, i - 4): i + 1]) for i in range(len(rs))]
    t = [r.get("time/round_s") or 0 for r in tr]
    last = tr[-1] if tr else {}
    print(f"{m.parent.relative_to(K)}: rounds {len(tr)} step {last.get('step')} | root success (rolling 5) "
          + " ".join(f"{x:.2f}" for x in roll[-12:]) + f" | best {max(roll, default=0):.2f}"
          + f" | round s {sum(t[-5:]) / max(1, len(t[-5:])):.0f} | |log rho| {last.get('loss/abs_log_ratio', 0):.3g}"
          + f" gn {last.get('grad_norm', 0):.3g} | eval (step, greedy, sampled) {ev}")
EOF
  for f in "$K"/*.log "$K"/*/*.log; do
    [ -f "$f" ] && grep -q -E "Traceback|Error" "$f" && { echo "== $f"; grep -E "Error|error:" "$f" | tail -3 | cut -c1-300; }
  done
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>/dev/null || true
}

pack() {  # metrics, configs, logs, eval reports and per-task outcomes in one tgz; the newest comparison checkpoints
  [ -n "${OUT:-}" ] || return 0
  $PY - "$K" <<'EOF'
import json, sys
from pathlib import Path
K = Path(sys.argv[1])
for d in K.glob("**/evals/step_*"):  # one line per task (the trees stay on the machine: 10-30 KB each)
    rows = []
    for f in sorted((d / "results").glob("*.json")):
        r = json.loads(f.read_text())
        rows.append({k: r.get(k) for k in ("index", "task_id", "tier", "success", "error", "nodes", "seconds")})
    (d / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
EOF
  (cd "$K" && find . \( -name vc -o -name checkpoints -o -name results \) -prune -o -type f \
     \( -name 'metrics.jsonl' -o -name 'config.json' -o -name '*.log' -o -name 'report.json' -o -name 'manifest.json' \
        -o -name 'tasks.jsonl' -o -name 'deadline_trees.jsonl' -o -name 'val.jsonl' -o -name 'train8.jsonl' \) \
        -size -8M -print | tar -czf "$OUT/L.tgz" -T -)
  for d in "$K"/rl_*/s*; do  # LoRA checkpoints are small enough to carry back (16 MiB a file)
    [ -d "$d/checkpoints" ] || continue
    local last; last=$(ls -d "$d"/checkpoints/step_* 2>/dev/null | sort | tail -1)
    [ -n "$last" ] || continue
    local size; size=$(stat -c %s "$last/state.pt")
    local name; name=$(echo "${d#"$K"/}" | tr / _)_$(basename "$last").pt
    if [ "$size" -lt 16000000 ]; then cp "$last/state.pt" "$OUT/$name"; else echo "not packed ($size bytes): $last"; fi
  done
  ls -l "$OUT"
}

case "${1:-watch}" in
start)
  rm -rf "$SNAP" && mkdir -p "$SNAP" \
    && tar --exclude=./.whl --exclude=./runs --exclude=./.git --exclude=./.venv -cf - . | (cd "$SNAP" && tar -xf -)
  nvidia-smi --query-gpu=name,memory.used --format=csv,noheader 2>/dev/null || true
  (cd "$SNAP" && $PY -m sera data textcraft --split val --n "$VAL" --seed 0 --difficulty easy --out "$K/val.jsonl" \
     && $PY -m sera data textcraft --split train --n 8 --seed 0 --difficulty easy --out "$K/train8.jsonl") > "$K/data.log" 2>&1 \
     || { cat "$K/data.log"; exit 1; }
  first=1
  IFS='|' read -ra VS <<< "$VARIANTS"
  for v in "${VS[@]}"; do
    name=${v%%:*}; flags=${v#*:}
    run "tiny/$name" --method rao --tasks "$K/train8.jsonl" --steps "$TINY_STEPS" --save-every 1000 $flags
    [ $first = 1 ] && [ "${DRY:-0}" != 1 ] && sleep 40  # the first converts the GGUF and merges the adapter once
    first=0
  done
  for s in $SEEDS; do for m in $METHODS; do run "rl_$m/s$s" $(cmp_flags $m $s); done; done
  sleep 20; summary
  ;;
resume)  # comparison runs from carried checkpoints: DIR holds rl_<m>_s<seed>_step_NNNNNN.pt files
  for f in "${2:?DIR}"/rl_*_s*_step_*.pt; do
    b=$(basename "$f" .pt); m=$(echo "$b" | cut -d_ -f2); s=$(echo "$b" | cut -d_ -f3 | tr -d s)
    step=$(echo "$b" | sed 's/.*_step_//'); mkdir -p "$K/rl_$m/s$s/checkpoints/step_$step"
    cp "$f" "$K/rl_$m/s$s/checkpoints/step_$step/state.pt"
    run "rl_$m/s$s" $(cmp_flags "$m" "$s") --resume
  done
  ;;
stop)
  pkill -TERM -f "[m] sera train" ; sleep 15; summary; pack
  ;;
watch)
  S=${2:-540}; T0=$(date +%s)
  while [ $(( $(date +%s) - T0 + 60 )) -le "$S" ]; do sleep 60; echo "--- $(( $(date +%s) - T0 )) s"; summary; done
  summary; pack
  ;;
esac
