#!/usr/bin/env bash
# The tensor-core kernels of the 128x128 split side by side, in one device call:
#   bash benchmarks/compare_tc_kernels.sh          (writes under $OUT)
# builds, runs the Hopper kernel's GPU tests, then bench_cufft.py once per kernel request
# (MONARCH_FFTCONV_TC_KERNEL: sm80 = mma.sync, sm90 = wgmma, both warpgroups on a sequence; sm90-2seq = a warpgroup a sequence).
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh" > "$OUT/setup.log" 2>&1 || { tail -40 "$OUT/setup.log"; exit 1; }
tail -1 "$OUT/setup.log"
timeout 90 python3 -m pytest -q tests/test_cuda_sm90.py -p no:cacheprovider > "$OUT/tests_sm90.txt" 2>&1
grep -E "passed|failed|^FAILED|^E " "$OUT/tests_sm90.txt" | head -12
for kernel in sm80 sm90 sm90-2seq; do
  MONARCH_FFTCONV_TC_KERNEL=$kernel timeout 60 python3 benchmarks/bench_cufft.py \
    --methods 'reference,monarch-tc[bf16],monarch-tc[fp16]' --shapes "${SHAPES:-16x256x8192}" \
    --no-plots --no-profile --out "$OUT/bench_$kernel" > "$OUT/bench_$kernel.txt" 2>&1
  echo "== $kernel"; grep -E "^(reference|monarch)" "$OUT/bench_$kernel.txt"
done
MONARCH_FFTCONV_TC_KERNEL=sm90 timeout 90 python3 -m pytest -q -x tests/test_cuda.py -k "not kernel_compiles" \
  -p no:cacheprovider > "$OUT/tests_cuda_sm90.txt" 2>&1
grep -E "passed|failed|^FAILED" "$OUT/tests_cuda_sm90.txt" | head -5
