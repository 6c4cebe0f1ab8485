#!/usr/bin/env bash
# Does RL raise held-out success, and does SERA beat RAO? (issue #39) One command: the held-out task file ->
# SERA and RAO RL from the SAME shipped warm start (`--init-adapter auto`: SmolLM2 + the LoRA adapter of
# common/assets/warmstart/smollm2-textcraft, merged; no SFT phase), same train pool, seeds and number of
# optimizer steps, each run evaluating its current policy on N_EVAL held-out tasks at step 0 and at its last
# step (greedy, plus EVAL_SAMPLES sampled trajectories per task at the rollout temperature 1.0) on its own
# engine -> figure + table with 95 % intervals (bench/plot_learning.py). TextCraft-Synth, easy tasks: every run
# trains on the same pool, the first N_TASKS easy tasks of the `train` split (one file, OUT/tc_train_easy.jsonl:
# `--n-tasks` alone would draw a different pool per --seed), every evaluation uses the held-out `val` split
# (other target items; it has 147 easy tasks, so N_EVAL is at most 147).
# The paper's batch (8 tasks x 8 rollouts) and SERA schedule (execution:16,delegation:2,rubric:2); level 1.
#
#   bash bench/learning.sh OUT                                 # one H200: ENGINE=vllm, all 4 runs at once
#   BUDGET_S=570 ENGINE=vllm bash bench/learning.sh OUT        # a time-limited GPU job: run it again to go on
#   (time-limited, resumable GPU jobs: docs/gpu_jobs.md)
#   MODEL=tiny ENGINE=hf SEEDS=0 RL_STEPS=1 N_EVAL=2 EVAL_SAMPLES=0 N_TASKS=8 TASKS_PER_STEP=1 ROLLOUTS=2 \
#     SCHEDULE=execution:1,delegation:1,rubric:1 AGENT="--max-steps 2 --max-new-tokens 12" \
#     CALLS="--rubric-max-new-tokens 16 --score-max-new-tokens 16" RL_LR=1e-3 \
#     RL_EXTRA="--codeact-executor worker-ordered --oracle-mix 0.7 --score-noise 0.3" \
#     PYTHON=.venv/bin/python bash bench/learning.sh runs/learning_dry   # CPU dry run, about 1 min on 2 cores
#
# Run directories: OUT/rl_sera/s<seed>/ and OUT/rl_rao/s<seed>/ (metrics.jsonl, evals/step_SSSSS[_sample_k]/,
# checkpoints/); OUT/tc_train_easy.jsonl, OUT/tc_val_easy.jsonl (train pool, held-out tasks); OUT/times.txt (what
# ran when); OUT/<phase>.log; OUT/learning.md + OUT/learning.png (bench/plot_learning.py, redrawn every job).
#
# Knobs (environment; default in brackets):
#   MODEL [smollm2]  INIT_ADAPTER [auto; none for MODEL=tiny]  ENGINE [vllm if nvidia-smi sees a GPU, else hf]
#   SEEDS ["0 1"]  METHODS ["sera rao"]  RL_STEPS [40]  RL_LR [1e-5]  TASKS_PER_STEP [8]  ROLLOUTS [8]
#   N_TASKS [256] (train pool, of the split's 588 easy tasks)
#   SCHEDULE [execution:16,delegation:2,rubric:2] (SERA's stage cycle)
#   N_EVAL [147] (held-out val tasks: all easy ones)  EVAL_SAMPLES [2] (sampled trajectories per held-out
#   task; 0 omits the --eval-samples flag)  EVAL_EVERY [RL_STEPS] (so: step 0 and the last step)
#   AGENT / CALLS [the warm start's agent sizes: --max-steps 3 --max-depth 3 --max-new-tokens 256
#   --max-prompt-tokens 2048 / --rubric-max-new-tokens 320 --score-max-new-tokens 256 --counterfactual-k 4]
#   BATCH [256] (engine batch)  RL_IDLE [10] (--max-idle-rounds)  RL_TURNS [RL_STEPS] (the steps each turn
#   trains to; every turn's end is also evaluated, `sera train` evaluates its last --steps)
#   RL_EXTRA (flags for every run), SERA_EXTRA / RAO_EXTRA (flags for one method's runs)
#   PARALLEL [1 with ENGINE=vllm, else 0]: the runs of a turn side by side on one GPU (a round is a chain of
#   dependent generations, so one run leaves most of a GPU idle), as many at once as fit the card
#   (bench/gpu_fit.py: the card's memory from nvidia-smi, a run's budget RUN_GIB [bench/gpu_fit.tsv's row for
#   MODEL and LoRA/full]; the rest wait for a slot; a run that cannot fit the card stops the job in one line
#   before anything starts), each given --gpu-share RUN_GIB/card (its trainer sizes itself to it) and a fixed
#   KV_GIB [4] GiB KV cache, each with its own vLLM compile cache (OUT/vllm_cache/<run>)
#   PYTHON [python3]  BUDGET_S [100000]  PHASES ["data rl_sera rl_rao"] (which phases this job may run)
#
# Resumable anywhere: every phase leaves OUT/<phase>.done and is skipped once done; a phase cut by the budget
# (or a kill) resumes from its own files on the next job: `sera train --resume` from its last checkpoint (one
# per optimizer step, so at most one round is redone), evaluations from their finished tasks. Each run is ONE
# process per job: its vLLM engine starts once, stays resident through the optimizer steps (weights copied in
# place) and runs the evaluations too. BUDGET_S: no phase runs past that many seconds of this job.
set -u
O=${1:-runs/learning}; mkdir -p "$O"; O=$(cd "$O" && pwd)
MODEL=${MODEL:-smollm2}
if [ -z "${ENGINE:-}" ]; then ENGINE=hf; nvidia-smi -L > /dev/null 2>&1 && ENGINE=vllm; fi
if [ "$MODEL" = tiny ]; then INIT_ADAPTER=${INIT_ADAPTER:-none}; else INIT_ADAPTER=${INIT_ADAPTER:-auto}; fi
SEEDS=${SEEDS:-"0 1"}; METHODS=${METHODS:-"sera rao"}
RL_STEPS=${RL_STEPS:-40}; RL_LR=${RL_LR:-1e-5}; TASKS_PER_STEP=${TASKS_PER_STEP:-8}; ROLLOUTS=${ROLLOUTS:-8}
N_TASKS=${N_TASKS:-256}; SCHEDULE=${SCHEDULE:-execution:16,delegation:2,rubric:2}
N_EVAL=${N_EVAL:-147}; EVAL_SAMPLES=${EVAL_SAMPLES:-2}; EVAL_EVERY=${EVAL_EVERY:-$RL_STEPS}
BATCH=${BATCH:-256}; BUDGET_S=${BUDGET_S:-100000}
PHASES=${PHASES:-"data rl_sera rl_rao"}
if [ "$ENGINE" = vllm ]; then PARALLEL=${PARALLEL:-1}; else PARALLEL=${PARALLEL:-0}; fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY=${PYTHON:-python3}; SERA="$PY -m sera"
source "$(dirname "$0")/phase.sh"  # el, log, run_phase
# The agent's sizes, the same in training and every evaluation: the ones the shipped warm start was made with
# (common/assets/warmstart/smollm2-textcraft/README.md; TextCraft easy tasks need 1-3 crafts).
AGENT=${AGENT:-"--max-steps 3 --max-depth 3 --max-new-tokens 256 --max-prompt-tokens 2048"}
CALLS=${CALLS:-"--rubric-max-new-tokens 320 --score-max-new-tokens 256 --counterfactual-k 4"}
EVAL_TASKS="$O/tc_val_easy.jsonl"; TRAIN_TASKS="$O/tc_train_easy.jsonl"
SAMPLES=""; [ "$EVAL_SAMPLES" != 0 ] && SAMPLES="--eval-samples $EVAL_SAMPLES"
RL="$SERA train --level 1 --model $MODEL --init-adapter $INIT_ADAPTER --tasks-per-step $TASKS_PER_STEP \
 --rollouts-per-task $ROLLOUTS $AGENT $CALLS --lr $RL_LR --save-every 1 --max-batch-size $BATCH \
 --engine $ENGINE --tasks $TRAIN_TASKS --max-idle-rounds ${RL_IDLE:-10} \
 --eval-tasks $EVAL_TASKS --eval-every $EVAL_EVERY --eval-limit $N_EVAL $SAMPLES --resume ${RL_EXTRA:-}"
# (--seed, --steps, --out and the method's flags per run)

# phase GROUP NAME CMD...: run unless done or GROUP is not in PHASES, never past BUDGET_S; rc 0 marks it done,
# and so does rc 3 (`sera train` stopped before --steps: --max-idle-rounds rounds without an optimizer step;
# the log says why; its checkpoints are whole and the figure shows it as it is).
phase() {
  local group=$1; shift
  [[ " $PHASES " == *" $group "* ]] || return 0
  run_phase "$@"
}

phase data data_train $SERA data textcraft --split train --n "$N_TASKS" --seed 0 --difficulty easy --out "$TRAIN_TASKS"
phase data data $SERA data textcraft --split val --n "$N_EVAL" --seed 0 --difficulty easy --out "$EVAL_TASKS"
# Same warm start, train pool, seeds and step count; SERA cycles its three stages, RAO has Execution only.
method_flags() {
  case $1 in
    sera) echo "--method sera --schedule $SCHEDULE ${SERA_EXTRA:-}" ;;
    rao) echo "--method rao ${RAO_EXTRA:-}" ;;
    *) echo "--method $1" ;;  # another preset of `sera train --method`
  esac
}
n_runs=$(( $(echo $SEEDS | wc -w) * $(echo $METHODS | wc -w) ))
GPU=""; SLOTS=1
if [ "$PARALLEL" = 1 ] && [ "$ENGINE" = vllm ]; then
  TRAIN=full; [[ "${RL_EXTRA:-} ${SERA_EXTRA:-} ${RAO_EXTRA:-}" == *--lora-rank* ]] && TRAIN=lora
  gpu_slots "$n_runs" "$TRAIN"  # SLOTS, SHARE (or exit 2: one run does not fit this card)
  GPU="--gpu-share $SHARE --kv-cache-gib ${KV_GIB:-4}"
fi
for target in ${RL_TURNS:-$RL_STEPS}; do  # with PARALLEL=1 the runs of a turn side by side, SLOTS at once
  for seed in $SEEDS; do
    for m in $METHODS; do
      run="rl_${m}_s${seed}_$target"
      cmd=(phase "rl_$m" "$run" env VLLM_CACHE_ROOT="$O/vllm_cache/${m}_s$seed" $RL $(method_flags "$m") $GPU
           --seed "$seed" --steps "$target" --out "$O/rl_$m/s$seed")
      if [ "$PARALLEL" = 1 ]; then in_slot "${cmd[@]}"; else "${cmd[@]}"; fi
    done
  done
  wait
done
# The figure and table of whatever exists so far (every job; a run not started yet shows as "not run").
$PY bench/plot_learning.py "$O" > "$O/plot.log" 2>&1 || log "plot failed: see $O/plot.log"
log "job finished"
