#!/usr/bin/env bash
# One call on the GPU machine: install what is missing, build the extension, run every
# test (GPU ones included), then the benchmark. Logs and results go to $OUT (or ./gpu_out).
#
#   bash benchmarks/run_gpu.sh                 # tests + seed benchmark
#   BENCH_ARGS="--preset lengths" bash benchmarks/run_gpu.sh
#   SKIP_TESTS=1 bash benchmarks/run_gpu.sh    # benchmark only
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

# The device image has torch, nvcc and ninja but not nvidia-cutlass: install the carried wheel.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export MONARCH_FFTCONV_BUILD_DIR=${MONARCH_FFTCONV_BUILD_DIR:-/tmp/monarch_fftconv_build}
export MAX_JOBS=${MAX_JOBS:-16}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

echo "== build"
start=$(date +%s)
python3 - <<'PY' 2>&1 | tee "$OUT/build.log"
from monarch_fftconv import _extension
_extension.build(verbose=False)
print("extension built")
PY
status=${PIPESTATUS[0]}
echo "build took $(( $(date +%s) - start )) s (status $status)"
[ "$status" -eq 0 ] || exit "$status"

if [ -z "${SKIP_TESTS:-}" ]; then
  echo "== tests"
  python3 -m pytest -q -x ${TEST_ARGS:-tests} 2>&1 | tee "$OUT/tests.log" | tail -25
fi

echo "== benchmark"
python3 benchmarks/bench_cufft.py --out "$OUT/bench" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
