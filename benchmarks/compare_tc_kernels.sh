#!/usr/bin/env bash
# The tensor-core kernels of the 128x128 split side by side, in one device call:
#   bash benchmarks/compare_tc_kernels.sh          (writes under $OUT)
# builds, runs the engine's GPU tests, then bench_cufft.py once per kernel request
# (MONARCH_FFTCONV_TC_KERNEL: mma = the mma.sync kernel, engine = the tensor-core engine; fp32
# I/O rows) beside the fp32 kernel.
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh" > "$OUT/setup.log" 2>&1 || { tail -40 "$OUT/setup.log"; exit 1; }
tail -1 "$OUT/setup.log"
timeout 150 python3 -m pytest -q tests/test_cuda_engine.py -p no:cacheprovider > "$OUT/tests_engine.txt" 2>&1
grep -E "passed|failed|^FAILED|^E " "$OUT/tests_engine.txt" | head -12
for kernel in mma engine; do
  MONARCH_FFTCONV_TC_KERNEL=$kernel timeout 90 python3 benchmarks/bench_cufft.py \
    --methods 'reference,monarch[fp32],monarch-tc[bf16],monarch-tc[fp16]' --shapes "${SHAPES:-16x256x8192}" \
    --no-plots --no-profile --out "$OUT/bench_$kernel" > "$OUT/bench_$kernel.txt" 2>&1
  echo "== $kernel"; grep -E "^(reference|monarch)" "$OUT/bench_$kernel.txt"
done
