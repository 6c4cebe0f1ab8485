#!/usr/bin/env bash
# Does the policy learn, and does SERA beat RAO? One command: data -> SFT warm start -> SERA and RAO RL, in
# turns, from that same warm start (same tasks, seeds, number of optimizer steps), each evaluating its
# current policy on the held-out tasks at step 0 (= the SFT model) and every EVAL_EVERY steps on its own
# engine (`--eval-tasks/--eval-every`) -> the base model's held-out eval -> figure + table
# (bench/plot_learning.py). TextCraft-Synth, easy tasks: training draws the `train` split, every
# evaluation the held-out `val` split (other target items).
#
#   ENGINE=vllm bash bench/learning.sh OUT_DIR          # one H200, SmolLM2 (bench/RESULTS.md: round times)
#   BUDGET_S=570 ENGINE=vllm bash bench/learning.sh OUT  # a 10-minute machine call: run it again to go on
#   PARALLEL=1 ENGINE=vllm bash bench/learning.sh OUT    # SERA and RAO at the same time on one GPU
#   MODEL=tiny SFT_STEPS=4 RL_STEPS=2 EVAL_EVERY=1 N_EVAL=2 bash bench/learning.sh runs/learning_dry   # CPU
#
# Knobs (environment): MODEL, ENGINE (hf | vllm), SFT_STEPS/SFT_TASKS/SFT_LR, RL_STEPS/RL_LR, RL_TURNS (the
# step each SERA/RAO turn trains to; default half, then all; with PARALLEL=1 one turn to RL_STEPS), N_EVAL/EVAL_EVERY (held-out tasks, how often),
# BATCH (engine batch), AGENT/CALLS (agent sizes, rubric/score caps), RL_EXTRA/SFT_EXTRA (more flags),
# PYTHON (interpreter), BUDGET_S, PHASES, PARALLEL (1: each turn runs SERA and RAO at the same time; a
# round is a chain of dependent generations, so one run leaves most of a GPU idle: two share it, each
# engine with GPU_MEM of its memory and a fixed KV_GIB KV cache, each with its own vLLM compile cache).
#
# Resumable anywhere: every phase leaves OUT_DIR/<phase>.done and is skipped once done; a phase cut by the
# budget (or a kill) resumes from its own files on the next call: `sera sft --resume` and `sera train
# --resume` from their last checkpoint (one per optimizer step, so at most one round is redone), evaluations
# from their finished tasks. Each RL phase is ONE process per call: its vLLM engine starts once, stays
# resident through the optimizer steps (weights copied in place) and runs the evaluations too.
# BUDGET_S: no phase runs past that many seconds of this call. PHASES: which phases this call may run.
set -u
O=${1:-runs/learning}; mkdir -p "$O"; O=$(cd "$O" && pwd)
MODEL=${MODEL:-smollm2}; ENGINE=${ENGINE:-hf}
SFT_STEPS=${SFT_STEPS:-120}; SFT_TASKS=${SFT_TASKS:-64}; SFT_LR=${SFT_LR:-1e-4}
RL_STEPS=${RL_STEPS:-20}; RL_LR=${RL_LR:-1e-5}; N_EVAL=${N_EVAL:-32}; EVAL_EVERY=${EVAL_EVERY:-5}
BATCH=${BATCH:-256}; BUDGET_S=${BUDGET_S:-100000}
PHASES=${PHASES:-"data sft rl_sera rl_rao eval_base"}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY=${PYTHON:-python3}; SERA="$PY -m sera"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[$(el) s] $*" | tee -a "$O/times.txt"; }
# The agent's sizes, the same in SFT, RL and every evaluation (TextCraft easy tasks need 1-3 crafts), and
# the rubric / score reply caps of SFT and RL.
AGENT=${AGENT:-"--max-steps 4 --max-new-tokens 320"}
CALLS=${CALLS:-"--rubric-max-new-tokens 384 --score-max-new-tokens 128"}
EVAL_TASKS="$O/tc_val_easy.jsonl"
RL="$SERA train --level 1 --model $O/sft/model --tasks-per-step 4 --rollouts-per-task 4 $AGENT $CALLS \
 --lr $RL_LR --save-every 1 \
 --max-batch-size $BATCH --engine $ENGINE --difficulty easy --n-tasks 256 --max-idle-rounds ${RL_IDLE:-6} \
 --eval-tasks $EVAL_TASKS --eval-every $EVAL_EVERY --eval-limit $N_EVAL ${RL_EXTRA:-}"  # --steps: per turn

# phase NAME CMD...: run unless done or not in PHASES, never past BUDGET_S; rc 0 marks it done, and so does
# rc 3 (`sera train` stopped before --steps: --max-idle-rounds rounds without an optimizer step; the log says
# why; its checkpoints are whole and the next phase goes on from them, as after a finished one).
phase() {
  local name=$1; shift
  [[ " $PHASES " == *" ${name%_[0-9]*} "* ]] || return 0  # rl_sera_10 is a turn of phase rl_sera
  [ -e "$O/$name.done" ] && { log "$name: done earlier"; return 0; }
  local left=$(( BUDGET_S - $(el) ))
  [ "$left" -lt 30 ] && { log "$name: not started (budget: ${left} s left)"; return 0; }
  log "$name: start (at most ${left} s): $*"
  # --foreground: the phase stays in this script's process group, so a Ctrl-C or a kill of the group
  # reaches it (plain timeout would move it to a group of its own, where it outlives the script)
  timeout --foreground "$left" "$@" >> "$O/$name.log" 2>&1; local rc=$?
  { [ $rc -eq 0 ] || [ $rc -eq 3 ]; } && touch "$O/$name.done"
  log "$name: rc=$rc$([ $rc -eq 124 ] && echo ' (budget: the next call resumes it)')$([ $rc -eq 3 ] && echo ' (stopped before --steps: see its log)')"
}

phase data $SERA data textcraft --split val --n "$N_EVAL" --seed 0 --difficulty easy --out "$EVAL_TASKS"
phase sft $SERA sft --model "$MODEL" --n-tasks "$SFT_TASKS" --difficulty easy --child-noise 0.5 \
  --steps "$SFT_STEPS" --batch-size 8 --lr "$SFT_LR" $AGENT $CALLS \
  --save-every 20 --resume ${SFT_EXTRA:-} --out "$O/sft"
# Same warm start, tasks, seeds and step count; SERA cycles its three stages, RAO has Execution only. They
# take turns (RL_TURNS: the step each turn trains to), so a budget that runs out leaves both at similar steps.
SERA_RL="$RL --method sera --schedule execution:2,delegation:1,rubric:2 --resume --out $O/rl_sera"
RAO_RL="$RL --method rao --resume --out $O/rl_rao"
if [ "${PARALLEL:-0}" = 1 ]; then
  SHARE="--gpu-memory-utilization ${GPU_MEM:-0.3} --kv-cache-gib ${KV_GIB:-12}"
  for target in ${RL_TURNS:-$RL_STEPS}; do  # one turn: both run at once, neither waits for the other
    phase "rl_sera_$target" env VLLM_CACHE_ROOT="$O/vllm_cache_sera" $SERA_RL $SHARE --steps "$target" &
    phase "rl_rao_$target" env VLLM_CACHE_ROOT="$O/vllm_cache_rao" $RAO_RL $SHARE --steps "$target" &
    wait
  done
else
  for target in ${RL_TURNS:-$(( RL_STEPS / 2 )) $RL_STEPS}; do
    phase "rl_sera_$target" $SERA_RL --steps "$target"
    phase "rl_rao_$target" $RAO_RL --steps "$target"
  done
fi
phase eval_base $SERA eval --env textcraft --tasks "$EVAL_TASKS" --limit "$N_EVAL" --concurrency "$N_EVAL" \
  --batch-size "$BATCH" --engine "$ENGINE" $AGENT --policy "hf:$MODEL" --init-adapter none --out "$O/eval_base"
# The figure and table of whatever exists so far (every call; a phase not run yet shows as "not run").
$PY bench/plot_learning.py "$O" > "$O/plot.log" 2>&1 || log "plot failed: see $O/plot.log"
log "call finished"
