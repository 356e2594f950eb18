#!/usr/bin/env bash
# The rows an A/B of the pending build switches times (benchmarks/ab_builds.sh runs this once per
# build and round): the plain fp32 forward (fp32 and bf16 I/O), the engine (bf16/fp16 operands,
# fp32 I/O; bf16 with bf16 I/O), the gated fp32 forward and the gated training step beside the
# runtime dpostgate method, b2b and latency medians from bench_cufft.py.
#
#   DEFINES="MONARCH_FFTCONV_TX_FENCES=1,MONARCH_FFTCONV_ENGINE_PRODUCER_REGS=72,MONARCH_FFTCONV_ENGINE_LOADS_IN_FLIGHT=8" \
#     TESTS="tests/test_cuda_engine.py tests/test_cuda_gated_training.py -x" TAIL=40 \
#     bash benchmarks/ab_builds.sh bash benchmarks/ab_rows.sh
#
# ROWS=short: the engine at 16x256x8192 and 64x768x8192, the fp32 forward at 16x256x{4096,8192}
# and the gated step only (a device call with little time left).
set -uo pipefail
cd "$(dirname "$0")/.."
bench() { python3 benchmarks/bench_cufft.py --no-plots --no-profile --reps 30 --out /tmp/ab_rows_out "$@" 2>&1 |
            grep -E "BxCxL|^monarch|^reference|^cudnn" | grep -v "^monarch.*backward  "; }
row() { echo "-- $1 (t=${SECONDS} s)"; shift; bench "$@"; }
if [ "${ROWS:-all}" = short ]; then
  row "engine bf16" --shapes 16x256x8192,64x768x8192 --methods "monarch[bf16]"
  row "plain fp32, fp32 I/O" --shapes 16x256x4096,16x256x8192 --methods "monarch[fp32]"
else
  row "plain fp32, fp32 I/O" --shapes 16x256x2048,16x256x4096,16x256x8192 --methods "monarch[fp32]"
  row "plain fp32, bf16 I/O" --shapes 16x256x4096,16x256x8192 --io-dtype bfloat16 --methods "monarch[fp32]"
  row "engine bf16/fp16" --shapes 16x256x8192,64x768x8192 --methods "monarch[bf16],monarch[fp16]"
  row "engine bf16, bf16 I/O" --shapes 16x256x8192,64x768x8192 --io-dtype bfloat16 --methods "monarch[bf16]"
  row "gated fp32 forward" --operator gated --shapes 16x256x8192 --methods "monarch[fp32]"
fi
row "gated fp32 step (dpostgate: a runtime method)" --operator gated --backward --shapes 16x256x8192 \
  --methods "monarch[fp32],monarch-dpostgate-in-grad"
