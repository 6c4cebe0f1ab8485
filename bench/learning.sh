#!/usr/bin/env bash
# Issue #15: does the policy learn? SFT warm start -> held-out eval -> SERA and RAO RL from the same warm
# start -> held-out eval of each. TextCraft-Synth, easy tasks; training draws the `train` split, every eval
# the held-out `val` split (other target items: the paper's item split), never trained on.
#
#   bash bench/learning.sh OUT_DIR                       # SmolLM2 sizes, one H200
#   ENGINE=vllm bash bench/learning.sh OUT_DIR           # evals and RL rollouts on the in-process vLLM engine
#   SFT_EXTRA=--no-look-up bash bench/learning.sh OUT_DIR   # SFT on the plain oracle (it invents recipes)
#   MODEL=tiny SFT_STEPS=4 RL_STEPS=2 N_EVAL=4 bash bench/learning.sh runs/learning_dry   # CPU dry run
#
# Measured on one H200 with the hf engine (bench/RESULTS.md): SFT 110 steps ~190 s with its data; a greedy
# eval of 16 held-out tasks over 530 s (160-270 s per delegating task), so RL needs ENGINE=vllm to fit.
#
# Every phase is resumable and skipped once done (OUT_DIR/<phase>.done), so the job can span several
# machine calls of at most 10 minutes each: run the same command again and it continues (RL with
# --resume from its last checkpoint). PHASES limits what this call runs (default: all, in order).
# BUDGET_S: no phase runs past that many seconds of this call. SERA and RAO train in turns of RL_SLICE_S
# seconds each (a killed turn resumes from its last checkpoint), never past RL_UNTIL_S, so that both get the
# same machine time and the evaluations after them still fit. Results: `python bench/plot_learning.py OUT_DIR`.
set -u
O=${1:-runs/learning}; mkdir -p "$O"; O=$(cd "$O" && pwd)
MODEL=${MODEL:-smollm2}
SFT_STEPS=${SFT_STEPS:-120}; SFT_TASKS=${SFT_TASKS:-64}; SFT_LR=${SFT_LR:-1e-4}
RL_STEPS=${RL_STEPS:-12}; RL_LR=${RL_LR:-1e-5}; N_EVAL=${N_EVAL:-32}
BUDGET_S=${BUDGET_S:-100000}; PHASES=${PHASES:-"data eval_base sft eval_sft rl_sera rl_rao eval_sera eval_rao"}
BATCH=${BATCH:-64}; ENGINE=${ENGINE:-hf}; RL_SLICE_S=${RL_SLICE_S:-180}; RL_UNTIL_S=${RL_UNTIL_S:-$BUDGET_S}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY=${PYTHON:-python3}; SERA="$PY -m sera"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[$(el) s] $*" | tee -a "$O/times.txt"; }
# The agent's sizes, the same in SFT, RL and eval (TextCraft easy tasks need 1-3 crafts).
AGENT="--max-steps 4 --max-new-tokens 320"
EVAL_TASKS="$O/tc_val_easy.jsonl"
EV="$SERA eval --env textcraft --tasks $EVAL_TASKS --limit ${EVAL_LIMIT:-$N_EVAL} --concurrency $N_EVAL --batch-size $BATCH --engine $ENGINE $AGENT"
RL="$SERA train --level 1 --model $O/sft/model --tasks-per-step 4 --rollouts-per-task 4 $AGENT \
 --rubric-max-new-tokens 384 --score-max-new-tokens 128 --lr $RL_LR --steps $RL_STEPS --save-every 1 \
 --max-batch-size $BATCH --engine $ENGINE --difficulty easy --n-tasks 256 --max-idle-rounds ${RL_IDLE:-4} ${RL_EXTRA:-}"

# phase NAME TIMEOUT_S CMD...: run unless done; an RL phase that times out is resumed by the next call.
# UNTIL (default BUDGET_S) is the elapsed second of this call the phase may not run past.
phase() {
  local name=$1 limit=$2; shift 2
  [[ " $PHASES " == *" $name "* ]] || return 0
  [ -e "$O/$name.done" ] && { log "$name: done earlier"; return 0; }
  local left=$(( ${UNTIL:-$BUDGET_S} - $(el) ))
  [ "$left" -lt 30 ] && { log "$name: not started (budget)"; return 0; }
  [ "$limit" -gt "$left" ] && limit=$left
  log "$name: start (limit ${limit} s): $*"
  timeout "$limit" "$@" >> "$O/$name.log" 2>&1; local rc=$?
  [ $rc -eq 0 ] && touch "$O/$name.done"
  log "$name: rc=$rc"
}

phase data 60 $SERA data textcraft --split val --n "$N_EVAL" --seed 0 --difficulty easy --out "$EVAL_TASKS"
phase eval_base 300 $EV --policy "hf:$MODEL" --out "$O/eval_base"
phase sft 900 $SERA sft --model "$MODEL" --n-tasks "$SFT_TASKS" --difficulty easy --child-noise 0.5 \
  --steps "$SFT_STEPS" --batch-size 8 --lr "$SFT_LR" $AGENT --rubric-max-new-tokens 384 \
  --save-every 20 --resume ${SFT_EXTRA:-} --out "$O/sft"
phase eval_sft 300 $EV --policy "hf:$O/sft/model" --out "$O/eval_sft"
# Same warm start, tasks, seeds and step count; SERA cycles its three stages, RAO has Execution only.
for turn in 1 2 3 4 5 6 7 8 9 10 11 12; do
  [ -e "$O/rl_sera.done" ] && [ -e "$O/rl_rao.done" ] && break
  [ $(( RL_UNTIL_S - $(el) )) -lt 30 ] && break
  UNTIL=$RL_UNTIL_S phase rl_sera "$RL_SLICE_S" $RL --method sera --schedule execution:2,delegation:1,rubric:2 \
    --resume --out "$O/rl_sera"
  UNTIL=$RL_UNTIL_S phase rl_rao "$RL_SLICE_S" $RL --method rao --resume --out "$O/rl_rao"
done
# The evaluations of the RL runs take their last checkpoint: after RL finished, or at once with EVAL_NOW=1.
for m in sera rao; do
  { [ -e "$O/rl_$m.done" ] || [ "${EVAL_NOW:-0}" = 1 ]; } || continue
  if [[ " $PHASES " == *" eval_$m "* ]] && [ ! -e "$O/eval_$m.done" ]; then
    $PY -c "from level0_single_process.sft import export_checkpoint as e; e('$O/rl_$m', '$O/sft/model', '$O/rl_$m/model')" \
      >> "$O/eval_$m.log" 2>&1 || { log "eval_$m: rl_$m has no checkpoint (no optimizer step)"; continue; }
  fi
  phase "eval_$m" 300 $EV --policy "hf:$O/rl_$m/model" --out "$O/eval_$m"
done
log "call finished"
