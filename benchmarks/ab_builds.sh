#!/usr/bin/env bash
# Build-time switches against the default build, in one device call: the tree built once with the
# sources' defaults and once per variant (MONARCH_FFTCONV_NVCC_DEFINES set, a build directory of
# its own), all at once, then a command run ROUNDS times (default 2) with each build, in
# alternating processes, so that the machine's drift falls on all of them.
#
#   DEFINES=MONARCH_FFTCONV_ENGINE_FILTER_PEAK_EXPONENT=0 TESTS="tests/test_cuda_engine.py -k budget" \
#     bash benchmarks/ab_builds.sh python3 benchmarks/bench_cufft.py \
#     --shapes 16x256x8192,64x768x8192 --methods 'monarch[fp16]' --no-plots --no-profile
#   DEFINES="MONARCH_FFTCONV_FWD_PREFETCH_POINT=1;MONARCH_FFTCONV_FWD_PREFETCH_POINT=1,MONARCH_FFTCONV_FWD_DIRECT_SKIP=0" \
#     bash benchmarks/ab_builds.sh python3 benchmarks/kernel_times.py --shape 16x256x8192 --io-dtype bfloat16
#
# DEFINES: one variant, NAME=VALUE[,NAME=VALUE...], or several separated by ';' (builds named
# variant1, variant2, ...; one variant is named "variant"). Each is checked first (each entry a
# switch the sources default with #ifndef, an integer value: _extension.build_defines), before
# anything is built. TESTS, a pytest argument list, runs on each variant build before any timing:
# a variant whose tests fail is not timed (a switch's kernels are checked before they are timed),
# and if none is left nothing is. Each run's output: $OUT/ab_<build>_<round>.log; printed, its
# last TAIL lines (default 12) that match SHOW (a grep -E pattern, default every line), under the
# build's name.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: DEFINES=NAME=VALUE[,...][;NAME=VALUE...] bash benchmarks/ab_builds.sh COMMAND [ARGS...]"; exit 2; }
[ -n "${DEFINES:-}" ] || { echo "DEFINES is empty: no variant to compare"; exit 2; }
unset MONARCH_FFTCONV_NVCC_DEFINES  # the default build is the sources' defaults
IFS=';' read -r -a variant_defines <<< "$DEFINES"
for defines in "${variant_defines[@]}"; do
  [ -n "${defines// /}" ] || { echo "DEFINES: an empty variant (';;' or a trailing ';')"; exit 2; }
  MONARCH_FFTCONV_NVCC_DEFINES=$defines python3 -c \
    'import sys; sys.path.insert(0, "."); from monarch_fftconv import _extension; print("variant:", *_extension.build_defines())' ||
    exit 2
done

GPU_SETUP_NO_BUILD=1 source benchmarks/gpu_setup.sh
count=${#variant_defines[@]}
names=()
for i in $(seq 1 "$count"); do
  if [ "$count" -eq 1 ]; then names+=(variant); else names+=("variant$i"); fi
done
# The environment of build `name` (the default's is empty).
build_env() {
  [ "$1" = default ] && return
  local i
  for i in "${!names[@]}"; do
    if [ "${names[$i]}" = "$1" ]; then
      echo "MONARCH_FFTCONV_NVCC_DEFINES=${variant_defines[$i]}"
      echo "MONARCH_FFTCONV_BUILD_DIR=${VARIANT_BUILD_DIR:-$MONARCH_FFTCONV_BUILD_DIR}_$1"
    fi
  done
}
run_in() {  # run_in BUILD COMMAND...: the command with BUILD's environment
  local build=$1; shift
  local env_lines=()
  mapfile -t env_lines < <(build_env "$build")
  env "${env_lines[@]}" "$@"
}

echo "== build: the default and ${count} variant(s) at once"
jobs_each=$(( ${MAX_JOBS:-16} / (count + 1) > 0 ? ${MAX_JOBS:-16} / (count + 1) : 1 ))
pids=()
build_start=$(date +%s)
for build in default "${names[@]}"; do
  log="$OUT/build.log"; [ "$build" = default ] || log="$OUT/build_$build.log"
  run_in "$build" env MAX_JOBS=$jobs_each bash -c "$(declare -f build_extension)"'; build_extension "$1"' _ "$log" &
  pids+=($!)
done
failed=0
builds=(default "${names[@]}")
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; status=$?
  echo "${builds[$i]} build: status $status"
  if [ "$status" -ne 0 ]; then
    failed=1
    log="$OUT/build.log"; [ "${builds[$i]}" = default ] || log="$OUT/build_${builds[$i]}.log"
    tail -n 20 "$log"
  fi
done
echo "the builds took $(( $(date +%s) - build_start )) s ($jobs_each jobs each)"
[ "$failed" -eq 0 ] || exit 1

timed=()
for build in "${names[@]}"; do
  if [ -n "${TESTS:-}" ]; then
    tests_log="$OUT/ab_tests.log"; [ "$count" -eq 1 ] || tests_log="$OUT/ab_tests_$build.log"
    echo "== tests on $build ($(build_env "$build" | head -n 1)): $TESTS"
    # shellcheck disable=SC2086  # TESTS is a pytest argument list
    run_in "$build" timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider $TESTS > "$tests_log" 2>&1
    tests_status=$?
    tail -n 5 "$tests_log"
    if [ "$tests_status" -ne 0 ]; then
      echo "$build's tests failed (status $tests_status): not timed"
      continue
    fi
  fi
  timed+=("$build")
done
[ "${#timed[@]}" -gt 0 ] || { echo "every variant's tests failed: nothing timed"; exit 1; }

for round in $(seq 1 "${ROUNDS:-2}"); do
  for build in default "${timed[@]}"; do
    log="$OUT/ab_${build}_${round}.log"
    run_in "$build" timeout "${RUN_TIMEOUT:-150}" "$@" > "$log" 2>&1
    echo "== $build, round $round (status $?)"
    grep -E "${SHOW:-.}" "$log" | tail -n "${TAIL:-12}"
  done
done
