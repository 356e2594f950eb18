#!/usr/bin/env bash
# One call on the GPU machine: install what is missing, build the extension, run every
# test (GPU ones included), then the benchmark. Logs and results go to $OUT (or ./gpu_out).
#
#   bash benchmarks/run_gpu.sh                 # build, GPU tests, benchmarks
#   SHAPES=16x256x8192 bash benchmarks/run_gpu.sh
#   SKIP_TESTS=1 bash benchmarks/run_gpu.sh    # no tests (SKIP_FUZZ=1: no fuzz, SKIP_BWD=1: no fwd+bwd run, nor the long one)
#   TEST_ARGS=tests/test_cuda.py BENCH_ARGS="--no-plots" bash benchmarks/run_gpu.sh
#   BWD_SHAPES=16x256x8192,16x256x1024 bash benchmarks/run_gpu.sh   # fwd+bwd shapes (default: seed)
#   INSTALL_CHECK=1 bash benchmarks/run_gpu.sh  # also a wheel install and the AOT build, in fresh venvs
#   EXAMPLE=1 bash benchmarks/run_gpu.sh        # also examples/train_hyena.py (EXAMPLE_ARGS)
#   SKIP_LONG=1 bash benchmarks/run_gpu.sh      # no long-sequence run (--preset long, forward)
#   OPERATORS=1 bash benchmarks/run_gpu.sh      # also the operator rows (gated, grouped, bidirectional)
#                                               # and bf16 I/O, forward and fwd+bwd, at OP_SHAPES, and the
#                                               # switches' rows (ATen gates, grouped ops, scratch-route grad;
#                                               # the fused grad kernel at SPLIT_SHAPES, N = 32768)
#   BF16_IO=1 bash benchmarks/run_gpu.sh        # also the forward and fwd+bwd benchmarks with bf16 I/O
#                                               # at SHAPES and BWD_SHAPES ($OUT/bench_json_bf16/)
# cuDNN's rows (the cudnn method) need cuDNN >= 9.26: carry .cudnn_kit (and .whl) and gpu_setup.sh
# sets MONARCH_FFTCONV_CUDNN_KIT; each benchmark's limit then grows by cuDNN's first-call JIT.
# Results: $OUT/{gpu.txt,build.log,tests.log,fuzz.log,host.log,bench_fwd.log,bench_bwd.log,
#                bench_long.log,bench_bf16_{fwd,bwd}.log,install.log,bench.tgz,hyena/}, and $OUT/bench_json/{fwd,bwd,long}.json
# (also in bench.tgz, rewritten after each benchmark with every output so far):
# each benchmark's results.json, kept only when that benchmark finished. They are the input of
# benchmarks/readme_tables.py, which writes README.md's and docs/performance.md's tables from
# them; the last lines printed give the command.
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"

JSON_DIR="$OUT/bench_json"
rm -rf "$JSON_DIR" && mkdir -p "$JSON_DIR"   # this run's JSON only
BENCH_DIRS=()                                 # the /tmp output directories of this run's benchmarks
# pack: $OUT/bench.tgz afresh, every benchmark's output so far (the /tmp directories) and the JSON
# kept, after each benchmark: a device call returns only its first few files, and a call stopped
# at its time limit must still return what finished (session 34 lost the fwd+bwd JSON to both).
pack() {
  local json=(bench_json)
  [ -d "$OUT/bench_json_bf16" ] && json+=(bench_json_bf16)
  tar czf "$OUT/bench.tgz" -C "$OUT" "${json[@]}" -C /tmp "${BENCH_DIRS[@]}"
}
# keep_json NAME DIR STATUS: DIR/results.json into $JSON_DIR/NAME.json if the benchmark exited 0
keep_json() {
  [ -d "$2" ] && BENCH_DIRS+=("$(basename "$2")")
  if [ "$3" -eq 0 ] && [ -f "$2/results.json" ]; then
    cp "$2/results.json" "$JSON_DIR/$1.json"
  else
    echo "(the $1 benchmark exited with status $3: its JSON is not kept for the tables)"
  fi
  pack
}

# limit SECONDS SHAPE_COUNT: a benchmark's time limit, plus 45 s a shape for cuDNN's first call
# (its JIT takes 8-42 s a shape; timed apart, but inside the limit) where the cudnn rows run.
limit() { echo $(( $1 + ${MONARCH_FFTCONV_CUDNN_KIT:+45 * $2 +} 0 )); }
count() { echo "$1" | tr ',' '\n' | grep -c .; }

echo "== benchmark: forward, reference lengths and the Hyena shape"
SHAPES=${SHAPES:-16x256x8192,16x256x1024,16x256x2048,16x256x4096,16x256x16384,64x768x8192}
BWD_SHAPES=${BWD_SHAPES:-16x256x8192}
timeout "$(limit 200 "$(count "$SHAPES")")" python3 benchmarks/bench_cufft.py --shapes "$SHAPES" --out /tmp/bench_fwd ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_fwd.log"
keep_json fwd /tmp/bench_fwd "${PIPESTATUS[0]}"

if [ -z "${SKIP_TESTS:-}" ]; then
  echo "== tests"
  # The nvcc compile checks already ran in CI and in the build above. Those on test_build.py's
  # compiled_units fixture (the spill record, the engine's register split) compile all 14 units
  # again for ptxas's figures: 2-4 minutes of device time that CI spends instead (session 22's
  # GPU suite ran out of its limit behind them).
  timeout 420 python3 -m pytest -q -rf -k "not kernel_compiles and not fuzz_cuda and not spills_do_not_grow and not register_split_fits and not binding_compiles" \
    ${TEST_ARGS:-tests} 2>&1 | tee "$OUT/tests.log" | tail -30
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

if [ -z "${SKIP_BWD:-}" ]; then
  echo "== benchmark: forward + backward"
  timeout "$(limit 200 "$(count "$BWD_SHAPES")")" python3 benchmarks/bench_cufft.py --shapes "$BWD_SHAPES" --backward --energy --out /tmp/bench_bwd ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_bwd.log"
  keep_json bwd /tmp/bench_bwd "${PIPESTATUS[0]}"
fi

if [ -z "${SKIP_BWD:-}" ] && [ -z "${SKIP_LONG:-}" ]; then
  echo "== benchmark: long sequences, forward (--preset long: L = 16384 .. 4M)"
  timeout "$(limit 300 5)" python3 benchmarks/bench_cufft.py --preset long --out /tmp/bench_long ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_long.log"
  keep_json long /tmp/bench_long "${PIPESTATUS[0]}"
fi
if [ -n "${BF16_IO:-}" ]; then
  # Not table JSON either (readme_tables takes fp32-I/O runs): its own folder.
  mkdir -p "$OUT/bench_json_bf16"
  for pass in "" --backward; do
    shapes=$SHAPES name=bf16_fwd
    [ -n "$pass" ] && shapes=$BWD_SHAPES name=bf16_bwd
    echo "== benchmark: --io-dtype bfloat16 $pass"
    timeout "$(limit 200 "$(count "$shapes")")" python3 benchmarks/bench_cufft.py --io-dtype bfloat16 $pass --shapes "$shapes" \
      --no-plots --out "/tmp/bench_$name" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_$name.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] && cp "/tmp/bench_$name/results.json" "$OUT/bench_json_bf16/$name.json"
    [ -d "/tmp/bench_$name" ] && BENCH_DIRS+=("bench_$name")
    pack
  done
fi
if [ -n "${OPERATORS:-}" ]; then
  # Not table JSON: readme_tables takes plain fp32-I/O runs. Logs only.
  for pass in "" --backward; do
    for op in gated grouped bidirectional; do
      echo "== benchmark: --operator $op $pass"
      timeout 200 python3 benchmarks/bench_cufft.py --operator "$op" $pass --shapes "${OP_SHAPES:-16x256x8192}" \
        --no-plots --out "/tmp/bench_op_${op}${pass:+_bwd}" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_op_${op}${pass:+_bwd}.log"
    done
    echo "== benchmark: --io-dtype bfloat16 $pass"
    timeout 200 python3 benchmarks/bench_cufft.py --io-dtype bfloat16 $pass --shapes "${OP_SHAPES:-16x256x8192}" \
      --no-plots --out "/tmp/bench_bf16io${pass:+_bwd}" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_bf16io${pass:+_bwd}.log"
  done
  # The switches' rows beside the defaults: the ATen gates (backends.FUSED_GATES off),
  # the G filter rows repeated before the ops (GROUPS_IN_KERNELS off), the backward's scratch route.
  # FUSED_GATED_TRAINING off: the training step with the ATen gates, the route the fused step replaced.
  for spec in "gated:reference,monarch[fp32],monarch-aten-gates:" \
              "gated:monarch[fp32],monarch-unfused-gated-train:--backward" \
              "grouped:reference,monarch[fp32],monarch-grouped-repeat:--backward" \
              "plain:reference,monarch[fp32],monarch-scratch-grad:--backward"; do
    IFS=: read -r op methods pass <<< "$spec"
    echo "== benchmark: --operator $op $pass, $methods"
    timeout 200 python3 benchmarks/bench_cufft.py --operator "$op" $pass --methods "$methods" --shapes "${OP_SHAPES:-16x256x8192}" \
      --no-plots --out "/tmp/bench_switch_${op}${pass:+_bwd}" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_switch_${op}${pass:+_bwd}.log"
  done
  # The split backward (MONARCH_FFTCONV_GRAD_SPLIT, the default) exists at N = 32768 only: its own
  # shapes, the fused grad kernel it replaced beside it.
  echo "== benchmark: --backward, the fused grad kernel beside the default (split) and cuDNN"
  timeout 240 python3 benchmarks/bench_cufft.py --backward --methods "reference,monarch[fp32],monarch-fused-grad,cudnn" \
    --shapes "${SPLIT_SHAPES:-16x256x16384,8x512x12000}" --no-plots --out /tmp/bench_switch_split_bwd ${BENCH_ARGS:-} 2>&1 |
    tee "$OUT/bench_switch_split_bwd.log"
fi
pack

echo "== tables: this run's JSON is in $JSON_DIR ($(ls "$JSON_DIR" | tr '\n' ' '))"
echo "Where this repository's files are (for a copied-back \$OUT, its local path), regenerate"
echo "README.md's and docs/performance.md's tables from it, then check them:"
echo "  python3 benchmarks/readme_tables.py $JSON_DIR --figure docs/img/readme_times.png"
echo "  python3 benchmarks/readme_tables.py $JSON_DIR --figure docs/img/readme_times.png --check"

