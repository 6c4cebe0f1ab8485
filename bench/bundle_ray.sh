#!/usr/bin/env bash
# Ray 2.60 for a GPU machine WITHOUT network access (issue #22.7: bench/h200_level2_call.sh; docs/gpu_jobs.md;
# with network, `pip install ray==2.60.0` there instead), in pieces small enough to ride along with the jobs
# that carry the vLLM + SmolLM2 wheel bundle (bench/bundle_h200.sh packs them all). The machine this was made
# for has python3 3.12 and no network; one job carries at most 64 MiB (working tree + carried paths).
#
#   bash bench/bundle_ray.sh            # here, after building the vLLM wheel bundle (a few seconds)
#   PYVER=3.11 OUTDIR=.whl/dry DEPS_EXTRA=msgpack CODE=0 bash bench/bundle_ray.sh   # the CPU dry run's bundle
#
# Output (ignored by git: /.whl/ is in .gitignore):
#   .whl/ray/ray.part.aa ...       the ray wheel (79.3 MB) cut into PART_BYTES pieces (default 15,000,000)
#   .whl/ray/ray.manifest          the wheel's file name and sha256: the GPU machine checks the reassembled wheel
#   .whl/ray-deps/*.whl            what Ray 2.60 requires that the GPU machine's image lacks (below)
#   .whl/code.tar (+ code.commit)  with CODE=1 only: `git archive HEAD` (the working tree travels with every job,
#                                  so the current plan, bench/bundle_h200.sh, needs no snapshot)
#
# Ray 2.60's requirements (its METADATA): click, filelock, jsonschema, msgpack, packaging>=24.2,
# protobuf>=3.20.3, pyyaml, requests. The GPU machine's image (read 2026-11-17) had click, filelock, msgpack,
# packaging, protobuf, pyyaml, requests and their own requirements (attrs, certifi, idna, urllib3,
# charset-normalizer), so only jsonschema and its three requirements travel (the vLLM bundle's vllm-deps holds
# the same four; the GPU machine installs a carried one only when it is not importable, so an image package is
# never shadowed). Ray vendors psutil and colorama, and its runtime-env agent its own aiohttp. `ray.init` with
# exactly these ran on an H200 (with RAY_AUTH_MODE=disabled).
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
PYVER=${PYVER:-3.12}; OUTDIR=${OUTDIR:-.whl}; PART_BYTES=${PART_BYTES:-15000000}
DEPS="jsonschema referencing rpds-py jsonschema-specifications ${DEPS_EXTRA:-}"
gd=$(git rev-parse --git-dir); grep -qx '/.whl/' .gitignore "$gd/info/exclude" 2>/dev/null || echo '/.whl/' >> "$gd/info/exclude"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
plat=(--only-binary=:all: --python-version "$PYVER" --implementation cp --platform manylinux2014_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$tmp" ray==2.60.0
whl=$(cd "$tmp" && ls ray-2.60.0-*.whl)
rm -rf "$OUTDIR/ray" "$OUTDIR/ray-deps"; mkdir -p "$OUTDIR/ray" "$OUTDIR/ray-deps"
(cd "$tmp" && sha256sum "$whl") > "$OUTDIR/ray/ray.manifest"
split -b "$PART_BYTES" "$tmp/$whl" "$OUTDIR/ray/ray.part."
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps "${plat[@]}" -d "$OUTDIR/ray-deps" $DEPS
if [ "${CODE:-0}" = 1 ]; then
  git archive --format=tar -o "$OUTDIR/code.tar" HEAD && git rev-parse HEAD > "$OUTDIR/code.commit"
  [ -n "$(git status --porcelain --untracked-files=no)" ] && echo "note: uncommitted changes are NOT in code.tar (it is HEAD)"
fi
echo "ray wheel: $whl ($(stat -c %s "$tmp/$whl") bytes)"
ls -l "$OUTDIR/ray" "$OUTDIR/ray-deps" | grep -v '^total'
[ "${CODE:-0}" = 1 ] && ls -l "$OUTDIR/code.tar"
# The job plan: bench/bundle_h200.sh packs these with vLLM and SmolLM2 into parts that fit a job beside the
# working tree and prints it (the 7-job plan with 62 MB parts no longer fits beside a 14 MB tree).
exit 0
