#!/usr/bin/env bash
# Several Nsight Compute profiles in one device call, within its 10-minute limit.
#
#   bash benchmarks/profile_set.sh \
#     "eng   MONARCH_FFTCONV_TC_KERNEL=engine      KERNEL=regex:engine PRECISION=bf16" \
#     "mma   MONARCH_FFTCONV_TC_KERNEL=mma         KERNEL=regex:monarch_tc PRECISION=bf16" \
#     "grad  BACKWARD=1 KERNEL=regex:fftconv_fp32_grad PRECISION=fp32"
#
# Each argument: a name, then the environment of one benchmarks/profile_ncu.sh run. A profile
# with source counters takes ~110 s, so at most three fit beside the build; each run is cut at
# PROFILE_TIMEOUT seconds (default 150) and the set stops starting new ones after
# BUDGET seconds (default 420). Everything lands in one archive, $OUT/profiles.tgz
# (details.txt and source.csv per name; the .ncu-rep reports are left out, they are large),
# written even when the call is cut short: the device tool brings back a limited number of
# files, and nothing of a cut call that was not written yet.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
work=$(mktemp -d)
trap 'tar czf "$OUT/profiles.tgz" -C "$work" . 2>/dev/null' EXIT
SECTIONS=${SECTIONS:-"--section SpeedOfLight --section WarpStateStats --section SourceCounters --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis"}
start=$(date +%s)
for spec in "$@"; do
  read -r name envs <<< "$spec"
  if (( $(date +%s) - start > ${BUDGET:-420} )); then
    echo "== $name: skipped (the set's budget is spent)"
    continue
  fi
  mkdir -p "$work/$name"
  # shellcheck disable=SC2086  # envs is a list of NAME=value words
  env OUT="$work/$name" SECTIONS="$SECTIONS" $envs timeout "${PROFILE_TIMEOUT:-150}" \
    bash benchmarks/profile_ncu.sh > "$work/$name/log.txt" 2>&1
  rm -f "$work/$name"/*.ncu-rep
  echo "== $name ($(( $(date +%s) - start )) s)"
  grep -E "Duration|Registers Per|Eligible Warps|Issued Warp|Executed Ipc A|Achieved Occ" "$work/$name/details.txt" 2>/dev/null | head -8 || true
done
