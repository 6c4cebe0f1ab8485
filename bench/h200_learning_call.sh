#!/usr/bin/env bash
# One 10-minute call of the H200 learning run: goes on with `bench/learning.sh` where the last call stopped and
# packs what it has so far (times, logs, metrics, reports, figure; no weights) into $OUT/learn.tgz.
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
if [ -n "${OUT:-}" ]; then  # one archive of the small files (the machine returns few files, each size-capped):
  # checkpoints, models, compile caches, SFT data and rollout trees stay on the machine
  (cd "$RUN" && find . \( -name checkpoints -o -name model -o -name 'vllm_cache*' \) -prune -o -type f -size -3M \
    ! -name 'sft_data*' ! -name 'trees*' -print | tar -czf "$OUT/learn.tgz" -T -)
  ls -l "$OUT/learn.tgz"
fi
