#!/usr/bin/env bash
# On the GPU machine: the two ways a user installs the package, each into a fresh venv
# (torch from the system site), run from outside the checkout.
#   jit: a regular wheel carries monarch_fftconv/csrc/ and JIT-builds the kernels on first use;
#   aot: MONARCH_FFTCONV_BUILD_EXT=1 compiles monarch_fftconv._C into the wheel, which loads
#        with torch.ops.load_library and builds nothing.
# Each venv sees torch through a .pth of this interpreter's site-packages.
# Each prints the backend explain() names for fp32 and bf16, and the error against float64.
# The JIT check starts two processes at once on one build directory (the build lock).
#   bash benchmarks/check_install.sh [jit|aot ...]      (default: both)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$PWD
WORK=$(mktemp -d)
# Keep the carried wheels' site (CUTLASS headers) but not the checkout on the path.
PYTHONPATH=$(tr ':' '\n' <<<"${PYTHONPATH:-}" | grep -v -x -e "$REPO" -e '' | paste -sd: || true)
export PYTHONPATH

CHECK=$WORK/check.py
cat > "$CHECK" <<'PY'
import sys, torch, monarch_fftconv as mf
from monarch_fftconv import _extension
mode = sys.argv[1]
u, k = torch.randn(4, 8, 8192, device="cuda"), torch.randn(8, 8192, device="cuda") / 90
n = 2 * u.shape[-1]
ref = torch.fft.irfft(torch.fft.rfft(u.double(), n=n) * torch.fft.rfft(k.double(), n=n), n=n)[..., : u.shape[-1]]
for precision in ("fp32", "bf16"):
    y = mf.fftconv(u, k, precision=precision)
    info = mf.explain(u, k, precision=precision)
    err = ((y.double() - ref).norm() / ref.norm()).item()
    print(f"{mode}: {precision}: {info['backend']} ({info['kernel']}), rel L2 {err:.2e}")
    assert info["backend"].startswith("cuda-"), info
print(f"{mode}: package at {mf.__file__}; AOT library {_extension._aot_library()}")
print(f"{mode}: loaded libraries {sorted(torch.ops.loaded_libraries)}")
assert "site-packages" in mf.__file__
PY

for mode in "${@:-jit aot}"; do
  for m in $mode; do
    echo "== $m install"
    start=$(date +%s)
    if [ "$m" = aot ]; then
      MONARCH_FFTCONV_BUILD_EXT=1 python3 -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist-$m" "$REPO"
    else
      python3 -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist-$m" "$REPO"
    fi
    python3 -m venv "$WORK/venv-$m"
    # torch comes from this interpreter's site (which may itself be a venv), not the venv's base
    python3 -c 'import site; print("\n".join(site.getsitepackages()))' \
      > "$("$WORK/venv-$m/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/parent-site.pth"
    "$WORK/venv-$m/bin/python" -m pip install -q --no-deps --no-index "$WORK"/dist-"$m"/*.whl
    if [ "$m" = jit ]; then
      # Two processes start the JIT build at once in one build directory: torch's build lock
      # (a file baton) must make one wait for the other, and both must load a sound library.
      (cd "$WORK" && MONARCH_FFTCONV_BUILD_DIR="$WORK/jit-build-$m" "$WORK/venv-$m/bin/python" "$CHECK" "$m" > "$WORK/first.log" 2>&1) & first=$!
      (cd "$WORK" && MONARCH_FFTCONV_BUILD_DIR="$WORK/jit-build-$m" "$WORK/venv-$m/bin/python" "$CHECK" "$m-second" > "$WORK/second.log" 2>&1) & second=$!
      status_first=0; wait $first || status_first=$?
      status_second=0; wait $second || status_second=$?
      cat "$WORK/first.log" "$WORK/second.log"
      echo "jit: two concurrent first calls exited $status_first and $status_second"
      [ "$status_first" -eq 0 ] && [ "$status_second" -eq 0 ]
    else
      (cd "$WORK" && MONARCH_FFTCONV_BUILD_DIR="$WORK/jit-build-$m" "$WORK/venv-$m/bin/python" "$CHECK" "$m")
    fi
    [ "$m" = aot ] && ! ls "$WORK/jit-build-$m" >/dev/null 2>&1 && echo "aot: no JIT build directory was created"
    echo "$m: install + first call took $(( $(date +%s) - start )) s"
  done
done
