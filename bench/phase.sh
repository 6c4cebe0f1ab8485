# Sourced by bench/learning.sh and bench/tiny_set.sh (needs O and BUDGET_S set): the budget-bounded, resumable
# phases both drivers are made of.
#   run_phase NAME CMD...  runs CMD unless OUT/NAME.done exists, never past BUDGET_S seconds of this job (docs/gpu_jobs.md), its
#                          output appended to OUT/NAME.log; rc 0, and rc 3 (`sera train` stopped before --steps:
#                          --max-idle-rounds rounds without an optimizer step; its checkpoints are whole), mark it
#                          done; OUT/times.txt says what ran when.
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
