#!/usr/bin/env bash
# One call on the GPU machine: install what is missing, build the extension, run every
# test (GPU ones included), then the benchmark. Logs and results go to $OUT (or ./gpu_out).
#
#   bash benchmarks/run_gpu.sh                 # build, GPU tests, benchmarks
#   SHAPES=16x256x8192 bash benchmarks/run_gpu.sh
#   SKIP_TESTS=1 bash benchmarks/run_gpu.sh    # no tests (SKIP_FUZZ=1: no fuzz, SKIP_BWD=1: no fwd+bwd run)
#   TEST_ARGS=tests/test_cuda.py BENCH_ARGS="--no-plots" bash benchmarks/run_gpu.sh
#   BWD_SHAPES=16x256x8192,16x256x1024 bash benchmarks/run_gpu.sh   # fwd+bwd shapes (default: seed)
#   INSTALL_CHECK=1 bash benchmarks/run_gpu.sh  # also a wheel install and the AOT build, in fresh venvs
#   EXAMPLE=1 bash benchmarks/run_gpu.sh        # also examples/train_hyena.py (EXAMPLE_ARGS)
# Results: $OUT/{gpu.txt,build.log,tests.log,fuzz.log,host.log,bench_fwd.log,bench_bwd.log,
#                install.log,bench.tgz,hyena/}
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"

echo "== benchmark: forward, reference lengths and the Hyena shape"
SHAPES=${SHAPES:-16x256x8192,16x256x1024,16x256x2048,16x256x4096,16x256x16384,64x768x8192}
timeout 200 python3 benchmarks/bench_cufft.py --shapes "$SHAPES" --out /tmp/bench_fwd ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_fwd.log"
tar czf "$OUT/bench.tgz" -C /tmp bench_fwd

if [ -z "${SKIP_TESTS:-}" ]; then
  echo "== tests"
  # The nvcc compile check already ran in CI and in the build above.
  timeout 420 python3 -m pytest -q -rf -k "not kernel_compiles and not fuzz_cuda" ${TEST_ARGS:-tests} 2>&1 | tee "$OUT/tests.log" | tail -30
fi
if [ -z "${SKIP_FUZZ:-}" ]; then
  echo "== fuzz (its summary line counts the cases by backend)"
  timeout 300 python3 -m pytest -q -s tests/test_fuzz.py -k fuzz_cuda 2>&1 | tee "$OUT/fuzz.log" | grep -E "fuzz|passed|failed"
fi

echo "== host time per call, GPU idle"
timeout 120 python3 benchmarks/host_overhead.py 2>&1 | tee "$OUT/host.log"

if [ -n "${EXAMPLE:-}" ]; then
  echo "== training example"
  timeout 400 python3 examples/train_hyena.py --out "$OUT/hyena" ${EXAMPLE_ARGS:-} 2>&1 | tail -20 | tee "$OUT/hyena.log"
fi

if [ -n "${INSTALL_CHECK:-}" ]; then
  echo "== install check: wheel (JIT) and ahead-of-time build, fresh venvs"
  timeout 400 bash benchmarks/check_install.sh 2>&1 | tee "$OUT/install.log"
fi

[ -n "${SKIP_BWD:-}" ] && exit 0
echo "== benchmark: forward + backward"
timeout 200 python3 benchmarks/bench_cufft.py --shapes "${BWD_SHAPES:-16x256x8192}" --backward --energy --out /tmp/bench_bwd ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_bwd.log"
tar czf "$OUT/bench.tgz" -C /tmp bench_fwd bench_bwd
