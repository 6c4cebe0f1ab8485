#!/usr/bin/env bash
# The tiny-set check (issue #39): can RL fit 8 FIXED training tasks at all? RL from the shipped warm start
# (`--init-adapter auto`) on 8 fixed train-split easy tasks (OUT/train8.jsonl; 8 tasks x 8 rollouts a step,
# drawn from those 8 shuffled once per pass, so about one pass a step; a group without signal is replaced by
# another of the 8), no held-out evaluation, several VARIANTS of the optimizer settings side by side,
# then a summary per variant (bench/plot_tiny_set.py): root success per step with a rolling mean over 5 steps
# and its 95 % band, the first step where that mean reaches TARGET, the best rolling mean, steps done.
# A setting that cannot raise success on 8 tasks it trains on every step will not raise it on held-out ones.
#
#   bash bench/tiny_set.sh OUT                                   # one H200: ENGINE=vllm, the variants at once
#   BUDGET_S=570 bash bench/tiny_set.sh OUT                      # a time-limited GPU job: run again to go on
#   (time-limited, resumable GPU jobs: docs/gpu_jobs.md)
#   VARIANTS="lr1e-5:--lr 1e-5|lr3e-5:--lr 3e-5" STEPS=30 bash bench/tiny_set.sh OUT
#   MODEL=tiny ENGINE=hf STEPS=2 TASKS_PER_STEP=2 ROLLOUTS=2 AGENT="--max-steps 2 --max-new-tokens 12" \
#     CALLS="--rubric-max-new-tokens 16 --score-max-new-tokens 16" \
#     VARIANTS="a:--lr 1e-3|b:--lr 1e-3 --grad-clip 0.05" RL_EXTRA="--codeact-executor worker-ordered" \
#     PYTHON=.venv/bin/python bash bench/tiny_set.sh runs/tiny_dry   # CPU dry run, ~1-2 min on 2 cores
#
# VARIANTS: variants separated by "|", each NAME:FLAGS: NAME (letters, digits, . _ -) names its run directory
# OUT/NAME/, FLAGS (anything after the first ":") are added to that run's `sera train` command, after the
# common flags (so they override them). Default:
#   full_1e-5:--lr 1e-5|full_clip:--lr 1e-5 --grad-clip 0.05|lora_1e-4:--lora-rank 16 --lr 1e-4
#
# Knobs (environment; default in brackets): MODEL [smollm2]  INIT_ADAPTER [auto; none for MODEL=tiny]
#   ENGINE [vllm if nvidia-smi sees a GPU, else hf]  METHOD [rao] (sera: with SCHEDULE)  SCHEDULE [the
#   method's preset]  STEPS [60]  N_TRAIN [8] (fixed train tasks: OUT/train8.jsonl)  TASKS_PER_STEP [8]
#   ROLLOUTS [8]  SEED [0]  AGENT / CALLS [the warm start's agent sizes, as bench/learning.sh]  BATCH [256]
#   RL_IDLE [10] (--max-idle-rounds)  RL_EXTRA (flags for every variant, before the variant's own)
#   TARGET [0.5]  WINDOW [5] (summary)  PARALLEL [1 with ENGINE=vllm, else 0]: the variants side by side on
#   one GPU, as many at once as fit the card (bench/gpu_fit.py, as bench/learning.sh: RUN_GIB [the table's
#   budget for MODEL, LoRA when any variant has --lora-rank, else full]; the rest wait for a slot), each
#   given --gpu-share RUN_GIB/card and a fixed KV_GIB [4] GiB KV cache, each with its own vLLM compile cache
#   (OUT/vllm_cache/NAME)  PYTHON [python3]  BUDGET_S [100000]
#
# Resumable like bench/learning.sh: OUT/<phase>.done marks a finished phase (data, each variant); a variant
# cut by the budget or a kill goes on from its last checkpoint (`sera train --resume`, one checkpoint per
# optimizer step) on the next job; rc 3 (stopped before --steps: --max-idle-rounds rounds in a row without
# an optimizer step) counts as done. The summary (OUT/tiny_set.md, OUT/tiny_set.png) is redrawn every job.
set -u
O=${1:-runs/tiny_set}; mkdir -p "$O"; O=$(cd "$O" && pwd)
MODEL=${MODEL:-smollm2}
if [ -z "${ENGINE:-}" ]; then ENGINE=hf; nvidia-smi -L > /dev/null 2>&1 && ENGINE=vllm; fi
if [ "$MODEL" = tiny ]; then INIT_ADAPTER=${INIT_ADAPTER:-none}; else INIT_ADAPTER=${INIT_ADAPTER:-auto}; fi
METHOD=${METHOD:-rao}; STEPS=${STEPS:-60}; N_TRAIN=${N_TRAIN:-8}; SEED=${SEED:-0}
TASKS_PER_STEP=${TASKS_PER_STEP:-8}; ROLLOUTS=${ROLLOUTS:-8}; BATCH=${BATCH:-256}; BUDGET_S=${BUDGET_S:-100000}
VARIANTS=${VARIANTS:-"full_1e-5:--lr 1e-5|full_clip:--lr 1e-5 --grad-clip 0.05|lora_1e-4:--lora-rank 16 --lr 1e-4"}
if [ "$ENGINE" = vllm ]; then PARALLEL=${PARALLEL:-1}; else PARALLEL=${PARALLEL:-0}; fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY=${PYTHON:-python3}; SERA="$PY -m sera"
source "$(dirname "$0")/phase.sh"  # el, log, run_phase
AGENT=${AGENT:-"--max-steps 3 --max-depth 3 --max-new-tokens 256 --max-prompt-tokens 2048"}
CALLS=${CALLS:-"--rubric-max-new-tokens 320 --score-max-new-tokens 256 --counterfactual-k 4"}
TASKS="$O/train$N_TRAIN.jsonl"
SCHED=""; [ -n "${SCHEDULE:-}" ] && SCHED="--schedule $SCHEDULE"
RL="$SERA train --level 1 --model $MODEL --init-adapter $INIT_ADAPTER --method $METHOD $SCHED --tasks $TASKS \
 --tasks-per-step $TASKS_PER_STEP --rollouts-per-task $ROLLOUTS $AGENT $CALLS --save-every 1 \
 --max-batch-size $BATCH --engine $ENGINE --max-idle-rounds ${RL_IDLE:-10} --seed $SEED --steps $STEPS \
 --resume ${RL_EXTRA:-}"

# phase NAME CMD...: as in bench/learning.sh (skipped once OUT/NAME.done exists; never past BUDGET_S; rc 0
# or 3 marks it done).
phase() { run_phase "$@"; }

# Parse VARIANTS first: a bad name stops the job before anything runs.
IFS='|' read -r -a specs <<< "$VARIANTS"
names=(); flags=()
for spec in "${specs[@]}"; do
  spec=$(echo "$spec" | sed 's/^ *//; s/ *$//'); [ -z "$spec" ] && continue
  name=${spec%%:*}; f=""; [[ "$spec" == *:* ]] && f=${spec#*:}
  if ! [[ "$name" =~ ^[A-Za-z0-9._-]+$ ]] || [ "$name" = data ]; then
    echo "tiny_set.sh: bad variant name '$name' in VARIANTS (NAME:FLAGS|NAME:FLAGS, NAME of letters, digits, . _ -)" >&2
    exit 2
  fi
  for n in "${names[@]}"; do [ "$n" = "$name" ] && { echo "tiny_set.sh: variant '$name' twice in VARIANTS" >&2; exit 2; }; done
  names+=("$name"); flags+=("$f")
done
[ ${#names[@]} -gt 0 ] || { echo "tiny_set.sh: VARIANTS is empty" >&2; exit 2; }

phase data $SERA data textcraft --split train --n "$N_TRAIN" --seed 0 --difficulty easy --out "$TASKS"
GPU=""; SLOTS=1
if [ "$PARALLEL" = 1 ] && [ "$ENGINE" = vllm ]; then
  TRAIN=lora; for f in "${flags[@]}"; do [[ "${RL_EXTRA:-} $f" == *--lora-rank* ]] || TRAIN=full; done
  gpu_slots "${#names[@]}" "$TRAIN"  # SLOTS, SHARE (or exit 2: one run does not fit this card)
  GPU="--gpu-share $SHARE --kv-cache-gib ${KV_GIB:-4}"
fi
for i in "${!names[@]}"; do printf '%s\t%s\n' "${names[$i]}" "${flags[$i]}"; done > "$O/variants.txt"  # summary
for i in "${!names[@]}"; do
  name=${names[$i]}
  cmd=(phase "$name" env VLLM_CACHE_ROOT="$O/vllm_cache/$name" $RL $GPU ${flags[$i]} --out "$O/$name")
  if [ "$PARALLEL" = 1 ]; then in_slot "${cmd[@]}"; else "${cmd[@]}"; fi
done
wait
$PY bench/plot_tiny_set.py "$O" --target "${TARGET:-0.5}" --window "${WINDOW:-5}" > "$O/plot.log" 2>&1 \
  || log "summary failed: see $O/plot.log"
log "job finished"
