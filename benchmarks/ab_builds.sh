#!/usr/bin/env bash
# A build-time switch against the default build, in one device call: the tree built twice at once
# (the default, and with MONARCH_FFTCONV_NVCC_DEFINES=$DEFINES in a build directory of its own),
# then a command run ROUNDS times (default 2) with each build, in alternating processes, so that
# the machine's drift falls on both.
#
#   DEFINES=MONARCH_FFTCONV_ENGINE_FILTER_PEAK_EXPONENT=0 TESTS="tests/test_cuda_engine.py -k budget" \
#     bash benchmarks/ab_builds.sh python3 benchmarks/bench_cufft.py \
#     --shapes 16x256x8192,64x768x8192 --methods 'monarch[fp16]' --no-plots --no-profile
#   DEFINES=MONARCH_FFTCONV_FWD_PREFETCH_POINT=2 \
#     bash benchmarks/ab_builds.sh python3 benchmarks/kernel_times.py --shape 16x256x4096 --io-dtype bfloat16
#
# DEFINES is checked first (each entry a switch the sources default with #ifndef, an integer
# value: _extension.build_defines), before anything is built. TESTS, a pytest argument list, runs
# on the variant build before any timing: a switch's kernels are checked before they are timed.
# Each run's output: $OUT/ab_<build>_<round>.log; printed, its last TAIL lines (default 12) that
# match SHOW (a grep -E pattern, default every line), under the build's name.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: DEFINES=NAME=VALUE[,...] bash benchmarks/ab_builds.sh COMMAND [ARGS...]"; exit 2; }
[ -n "${DEFINES:-}" ] || { echo "DEFINES is empty: no variant to compare"; exit 2; }
unset MONARCH_FFTCONV_NVCC_DEFINES  # the default build is the sources' defaults
MONARCH_FFTCONV_NVCC_DEFINES=$DEFINES python3 -c \
  'import sys; sys.path.insert(0, "."); from monarch_fftconv import _extension; print("variant:", *_extension.build_defines())' ||
  exit 2

GPU_SETUP_NO_BUILD=1 source benchmarks/gpu_setup.sh
VARIANT_DIR=${VARIANT_BUILD_DIR:-${MONARCH_FFTCONV_BUILD_DIR}_variant}
variant_env=(MONARCH_FFTCONV_NVCC_DEFINES="$DEFINES" MONARCH_FFTCONV_BUILD_DIR="$VARIANT_DIR")

echo "== build: the default and the variant at once"
jobs_each=$(( ${MAX_JOBS:-16} / 2 > 0 ? ${MAX_JOBS:-16} / 2 : 1 ))
MAX_JOBS=$jobs_each build_extension "$OUT/build.log" &
default_build=$!
(export "${variant_env[@]}"; MAX_JOBS=$jobs_each build_extension "$OUT/build_variant.log") &
variant_build=$!
wait "$default_build"; default_status=$?
wait "$variant_build"; variant_status=$?
echo "default build: status $default_status; variant build: status $variant_status"
if [ "$default_status" -ne 0 ] || [ "$variant_status" -ne 0 ]; then
  tail -n 20 "$OUT/build.log" "$OUT/build_variant.log"
  exit 1
fi

if [ -n "${TESTS:-}" ]; then
  echo "== tests on the variant: $TESTS"
  # shellcheck disable=SC2086  # TESTS is a pytest argument list
  env "${variant_env[@]}" timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider $TESTS \
    > "$OUT/ab_tests.log" 2>&1
  tests_status=$?
  tail -n 5 "$OUT/ab_tests.log"
  [ "$tests_status" -eq 0 ] || { echo "the variant's tests failed (status $tests_status): nothing timed"; exit 1; }
fi

for round in $(seq 1 "${ROUNDS:-2}"); do
  for build in default variant; do
    log="$OUT/ab_${build}_${round}.log"
    if [ "$build" = variant ]; then
      env "${variant_env[@]}" timeout "${RUN_TIMEOUT:-150}" "$@" > "$log" 2>&1
    else
      timeout "${RUN_TIMEOUT:-150}" "$@" > "$log" 2>&1
    fi
    echo "== $build, round $round (status $?)"
    grep -E "${SHOW:-.}" "$log" | tail -n "${TAIL:-12}"
  done
done
