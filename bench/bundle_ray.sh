#!/usr/bin/env bash
# Ray 2.60 for the lent H200 (issue #22.7: bench/h200_level2_call.sh), in pieces small enough to ride along
# with the transfer calls of the vLLM + SmolLM2 bundle (../shared/gpu/bundle-vllm), plus a snapshot of the code.
# The device has python3 3.12 and no network; one call carries at most 64 MiB (working tree + carried paths).
#
#   bash bench/bundle_ray.sh            # here, after `bash ../shared/gpu/bundle-vllm` (a few seconds)
#   PYVER=3.11 OUTDIR=.whl/dry DEPS_EXTRA=msgpack CODE=0 bash bench/bundle_ray.sh   # the CPU dry run's bundle
#
# Output (ignored by git: /.whl/ is in .gitignore):
#   .whl/ray/ray.part.aa ...       the ray wheel (79.3 MB) cut into PART_BYTES pieces (default 15,000,000)
#   .whl/ray/ray.manifest          the wheel's file name and sha256: the device checks the reassembled wheel
#   .whl/ray-deps/*.whl            what Ray 2.60 requires that the device image lacks (below)
#   .whl/code.tar (+ code.commit)  `git archive HEAD`: the code every device call of the run uses (CODE=0: none)
# and the call plan of bench/h200_level2_call.sh with each call's bytes against the 64 MiB limit (exit 1 when a
# call would not fit).
#
# Ray 2.60's requirements (its METADATA): click, filelock, jsonschema, msgpack, packaging>=24.2,
# protobuf>=3.20.3, pyyaml, requests. The device image ('cuda', /work/.library/device/KINDS.md, read 2026-11-17)
# has click, filelock, msgpack, packaging, protobuf, pyyaml, requests and their own requirements (attrs,
# certifi, idna, urllib3, charset-normalizer), so only jsonschema and its three requirements travel (the vLLM
# bundle's vllm-deps holds the same four; the device installs a carried one only when it is not importable,
# so an image package is never shadowed). Ray vendors psutil and colorama, and its runtime-env agent its own
# aiohttp. `ray.init` with exactly these ran on an H200 (../shared/DEVICE.md, with RAY_AUTH_MODE=disabled).
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
if [ "${CODE:-1}" = 1 ]; then
  git archive --format=tar -o "$OUTDIR/code.tar" HEAD && git rev-parse HEAD > "$OUTDIR/code.commit"
  [ -n "$(git status --porcelain --untracked-files=no)" ] && echo "note: uncommitted changes are NOT in code.tar (it is HEAD)"
fi
echo "ray wheel: $whl ($(stat -c %s "$tmp/$whl") bytes)"
ls -l "$OUTDIR/ray" "$OUTDIR/ray-deps" | grep -v '^total'
[ "${CODE:-1}" = 1 ] && ls -l "$OUTDIR/code.tar"

# The call plan (bench/h200_level2_call.sh's header) and what each call carries, with the working tree that
# travels with every call (tracked files + untracked files git does not ignore).
[ "$OUTDIR" = .whl ] || exit 0
tree=$( { git ls-files -z; git ls-files -z -o --exclude-standard; } | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
size() { local s=0 p; for p in "$@"; do [ -e "$p" ] || { echo "missing: $p" >&2; echo -1; return; }; s=$(( s + $(du -sb "$p" | cut -f1) )); done; echo $s; }
mapfile -t rp < <(ls .whl/ray/ray.part.*)
n=${#rp[@]}; [ "$n" -ge 4 ] || { echo "expected >= 4 ray parts, got $n"; exit 1; }
calls=(
  ".whl/vllm/part.aa"
  ".whl/vllm/part.ab"
  ".whl/vllm/part.ac"
  ".whl/vllm/part.ad .whl/vllm-deps ${rp[0]}"
  ".whl/smollm2/part.aa ${rp[1]}"
  ".whl/smollm2/part.ab ${rp[2]}"
  "${rp[*]:3} .whl/ray/ray.manifest .whl/ray-deps .whl/code.tar .whl/code.commit"
)
limit=$(( 64 * 1024 * 1024 )); bad=0
printf 'working tree: %d bytes (travels with every call); limit %d bytes a call\n' "$tree" "$limit"
for i in "${!calls[@]}"; do
  # shellcheck disable=SC2086
  c=$(size ${calls[$i]}); t=$(( c + tree ))
  [ "$c" -lt 0 ] && { bad=1; continue; }
  ok=ok; [ "$t" -ge "$limit" ] && { ok="OVER THE LIMIT"; bad=1; }
  printf 'call %d: %10d bytes carried + tree = %10d (%5.1f MiB, %s): %s\n' $(( i + 1 )) "$c" "$t" \
    "$(echo "$t / 1048576" | bc -l)" "$ok" "${calls[$i]}"
done
exit $bad
