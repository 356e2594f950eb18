"""The grad kernel's uniform pair sweep (fp32/radix_pairs.cuh, for_each_pair_uniform: thread 0
in the other threads' code path) on the host (tests/pair_sweep_check.cu, built with nvcc, run
without a GPU): for every thread of every plan size, the same (slot, k, operands, twiddle) pairs
as for_each_pair and the same output registers, from the kernel's own index functions, and the
filter sweep's walks reading the staged spectrum's entries that kspec reads, and the stepped
filter copy filling the slots stage_index gives; the forward kernel's variant (thread 0's
operands moved first, the others' twiddles of steps u >= 8 turned by -i) giving the same pairs
and the same twiddle bits; the program also feeds the checks deliberately wrong maps and fails
unless every one is rejected."""

import shutil
import subprocess
from pathlib import Path

import pytest

from monarch_fftconv import _extension

NVCC = shutil.which("nvcc")
SOURCE = Path(__file__).resolve().parent / "pair_sweep_check.cu"

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not installed")


def build_and_run(source: Path, tmp_path: Path) -> str:
    """nvcc the host check, run it, and return its output once it passed."""
    exe = tmp_path / source.stem
    flags = [f for f in _extension.NVCC_FLAGS if f not in ("-lineinfo",)]
    build = subprocess.run([NVCC, *flags, f"-I{_extension.CSRC}", "-x", "cu", str(source), "-o", str(exe)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 failed" in run.stdout
    assert "NOT REJECTED" not in run.stdout and "FAILED" not in run.stdout
    return run.stdout


def test_uniform_pair_sweep_is_for_each_pairs_assignment(tmp_path):
    build_and_run(SOURCE, tmp_path)
