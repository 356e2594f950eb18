# Sourced by the GPU scripts (run_gpu.sh, profile_ncu.sh): install the carried wheels,
# set the paths and build the extension. Sets OUT; exits on a failed build.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

# The device image has torch, nvcc and ninja but not nvidia-cutlass: install the carried wheel.
# Installed once per machine: a reinstall gives every CUTLASS header a new mtime, and ninja then
# rebuilds the whole extension (a minute) in each script that sources this one.
if ls .whl/*.whl >/dev/null 2>&1; then
  if [ ! -e /tmp/site/.monarch_wheels_installed ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    touch /tmp/site/.monarch_wheels_installed
  fi
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}

source benchmarks/cudnn_kit_env.sh   # the cudnn rows: MONARCH_FFTCONV_CUDNN_KIT from a carried .cudnn_kit
export MONARCH_FFTCONV_BUILD_DIR=${MONARCH_FFTCONV_BUILD_DIR:-/tmp/monarch_fftconv_build}
export MAX_JOBS=${MAX_JOBS:-16}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

# build_extension LOG: the extension built (or found built) in $MONARCH_FFTCONV_BUILD_DIR with the
# environment's MONARCH_FFTCONV_NVCC_DEFINES; its output in LOG; the build's status.
build_extension() {
  python3 -c 'from monarch_fftconv import _extension; _extension.build(verbose=False); print("extension built")' > "$1" 2>&1
}

# GPU_SETUP_NO_BUILD=1: the caller builds (benchmarks/ab_builds.sh builds two trees at once).
if [ -z "${GPU_SETUP_NO_BUILD:-}" ]; then
  echo "== build"
  build_start=$(date +%s)
  build_extension "$OUT/build.log"
  build_status=$?
  cat "$OUT/build.log"
  echo "build took $(( $(date +%s) - build_start )) s (status $build_status)"
  [ "$build_status" -eq 0 ] || exit "$build_status"
fi
