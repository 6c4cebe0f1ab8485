# Sourced by bench/learning.sh and bench/tiny_set.sh (needs O and BUDGET_S set): the budget-bounded, resumable
# phases both drivers are made of.
#   run_phase NAME CMD...  runs CMD unless OUT/NAME.done exists, never past BUDGET_S seconds of this job (docs/gpu_jobs.md), its
#                          output appended to OUT/NAME.log; rc 0, and rc 3 (`sera train` stopped before --steps:
#                          --max-idle-rounds rounds without an optimizer step; its checkpoints are whole), mark it
#                          done; OUT/times.txt says what ran when.
#   gpu_slots N TRAIN      sizes N parallel runs to this GPU (bench/gpu_fit.py: the card's memory, a run's
#                          budget from bench/gpu_fit.tsv): sets SLOTS (runs at once) and SHARE (--gpu-share
#                          of each), or refuses in one line (exit 2) when one run does not fit the card
#                          (gpu_fit.py needs only the standard library: the system python3 runs it).
#   in_slot CMD...         runs CMD in the background once fewer than SLOTS started ones are running.
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[$(el) s] $*" | tee -a "$O/times.txt"; }
run_phase() {
  local name=$1; shift
  [ -e "$O/$name.done" ] && { log "$name: done earlier"; return 0; }
  local left=$(( BUDGET_S - $(el) ))
  [ "$left" -lt 30 ] && { log "$name: not started (budget: ${left} s left)"; return 0; }
  log "$name: start (at most ${left} s): $*"
  # --foreground: the phase stays in this script's process group, so a Ctrl-C or a kill of the group
  # reaches it (plain timeout would move it to a group of its own, where it outlives the script)
  timeout --foreground "$left" "$@" >> "$O/$name.log" 2>&1; local rc=$?
  { [ $rc -eq 0 ] || [ $rc -eq 3 ]; } && touch "$O/$name.done"
  log "$name: rc=$rc$([ $rc -eq 124 ] && echo ' (budget: the next job resumes it)')$([ $rc -eq 3 ] && echo ' (stopped before --steps: see its log)')"
}
gpu_slots() {
  local fit
  fit=$(python3 "$(dirname "${BASH_SOURCE[0]}")/gpu_fit.py" --runs "$1" --model "$MODEL" --train "$2" ${RUN_GIB:+--run-gib $RUN_GIB}) \
    || exit 2
  eval "$fit"; log "GPU: $fit ($1 runs wanted; at most $SLOTS at once, each --gpu-share $SHARE)"
}
in_slot() {
  while [ "$(jobs -rp | wc -l)" -ge "${SLOTS:-1}" ]; do wait -n; done
  "$@" &
}
