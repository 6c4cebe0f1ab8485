#!/usr/bin/env bash
# One 10-minute call of the H200 learning run: goes on with `bench/learning.sh` where the last call stopped and
# copies what it has so far (times, logs, metrics, reports, figure; no weights) to $OUT/learn.
#
# On the lent H200, after steps 1-6 of ../shared/gpu/device-vllm-steps.md (vLLM and SmolLM2 under /tmp/site),
# each call of the run is this one command; /tmp/keep survives between calls made back to back:
#
#   BUDGET_S=540 bash bench/h200_learning_call.sh        # again and again until times.txt says all done
#
# Simplifies: nothing; it only fixes the knobs of the README's Learning run (PARALLEL=1: SERA and RAO share
# the GPU, each with its own engine) and the environment the device needs.
set -u
export PYTHONPATH=/tmp/site:$PWD SERA_CACHE=/tmp/keep/cache VLLM_USE_FLASHINFER_SAMPLER=0 \
  VLLM_ALLOW_INSECURE_SERIALIZATION=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
RUN=${RUN:-/tmp/keep/learn}
BUDGET_S=${BUDGET_S:-540} PARALLEL=${PARALLEL:-1} ENGINE=vllm bash bench/learning.sh "$RUN"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv || true
if [ -n "${OUT:-}" ]; then  # the small files only: checkpoints, models and compile caches stay on the machine
  mkdir -p "$OUT/learn"
  (cd "$RUN" && find . \( -name checkpoints -o -name model -o -name 'vllm_cache*' \) -prune -o -type f \
    \( -name '*.jsonl' -o -name '*.json' -o -name '*.txt' -o -name '*.log' -o -name '*.md' -o -name '*.png' \) \
    -size -8M -print0 | xargs -0 -r cp --parents -t "$OUT/learn")
  du -sh "$OUT/learn"
fi
