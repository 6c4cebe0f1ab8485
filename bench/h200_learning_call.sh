#!/usr/bin/env bash
# One 10-minute call of the H200 learning run: goes on with `bench/learning.sh` where the last call stopped,
# then (once SERA and RAO have all their steps) with the speed benches of issue #21 on the same SFT model and
# the now unshared GPU, and packs what it has so far (times, logs, metrics, reports, figure, bench tables; no
# weights) into $OUT/learn.tgz.
#
# On the lent H200, after steps 1-6 of ../shared/gpu/device-vllm-steps.md (vLLM and SmolLM2 under /tmp/site),
# each call of the run is this one command; /tmp/keep survives between calls made back to back:
#
#   BUDGET_S=540 bash bench/h200_learning_call.sh        # again and again until times.txt says all done
#
# The benches (each once, a `bench_*.done` marker when it finished; a bench cut by the budget runs again):
#   bench_rounds:  bench/bench_rounds.py --paths after,after_mp (engine core in this process vs its own, the
#                  trainer alone on the GPU: train tok/s);
#   bench_startup: bench/bench_engine_startup.py (CUDA graphs with a cold / warm compile cache vs enforce_eager).
# BENCHES (default "bench_rounds bench_startup"; "" for none) picks them; ROUNDS_ARGS / STARTUP_ARGS add flags (CPU dry run).
#
# Simplifies: nothing; it only fixes the knobs of the README's Learning run (PARALLEL=1: SERA and RAO share
# the GPU, each with its own engine) and the environment the device needs.
set -u
export PYTHONPATH=/tmp/site:$PWD SERA_CACHE=${SERA_CACHE:-/tmp/keep/cache} VLLM_USE_FLASHINFER_SAMPLER=0 \
  VLLM_ALLOW_INSECURE_SERIALIZATION=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
RUN=${RUN:-/tmp/keep/learn}; PY=${PYTHON:-python3}
T0=$(date +%s); BUDGET_S=${BUDGET_S:-540}
BUDGET_S=$BUDGET_S PARALLEL=${PARALLEL:-1} ENGINE=vllm bash bench/learning.sh "$RUN"
RL_STEPS=${RL_STEPS:-20}
if [ -e "$RUN/rl_sera_$RL_STEPS.done" ] && [ -e "$RUN/rl_rao_$RL_STEPS.done" ]; then
  for b in ${BENCHES-bench_rounds bench_startup}; do  # BENCHES="" runs none
    [ -e "$RUN/$b.done" ] && continue
    left=$(( BUDGET_S - ($(date +%s) - T0) )); [ "$left" -lt 60 ] && { echo "$b: not started (${left} s left)" | tee -a "$RUN/times.txt"; break; }
    case $b in
      bench_rounds) cmd="$PY bench/bench_rounds.py --model $RUN/sft/model --paths after,after_mp --rounds 2 ${ROUNDS_ARGS:-}";;
      bench_startup) cmd="$PY bench/bench_engine_startup.py --model $RUN/sft/model --cache-dir /tmp/keep/startup_cache --out $RUN/bench_startup.json ${STARTUP_ARGS:-}";;
      *) echo "unknown bench $b"; continue;;
    esac
    echo "[$(( $(date +%s) - T0 )) s] $b: start (at most $left s): $cmd" | tee -a "$RUN/times.txt"
    # the compile cache of the RAO run is warm for this model: the rounds bench does not time start-ups
    VLLM_CACHE_ROOT=$RUN/vllm_cache_rao timeout --foreground "$left" $cmd > "$RUN/$b.log" 2>&1; rc=$?
    [ $rc -eq 0 ] && touch "$RUN/$b.done"
    echo "[$(( $(date +%s) - T0 )) s] $b: rc=$rc" | tee -a "$RUN/times.txt"
  done
fi
nvidia-smi --query-gpu=memory.used,memory.total --format=csv || true
if [ -n "${OUT:-}" ]; then  # one archive of the small files (the machine returns few files, each size-capped):
  # checkpoints, models, compile caches, SFT data and rollout trees stay on the machine
  (cd "$RUN" && find . \( -name checkpoints -o -name model -o -name 'vllm_cache*' \) -prune -o -type f -size -3M \
    ! -name 'sft_data*' ! -name 'trees*' -print | tar -czf "$OUT/learn.tgz" -T -)
  ls -l "$OUT/learn.tgz"
fi
