"""The grad kernel's uniform pair sweep (fp32/radix_pairs.cuh, for_each_pair_uniform: thread 0
in the other threads' code path) on the host (tests/pair_sweep_check.cu, built with nvcc, run
without a GPU): for every thread of every plan size, the same (slot, k, operands, twiddle) pairs
as for_each_pair and the same output registers, from the kernel's own index functions, and the
filter sweep's walks reading the staged spectrum's entries that kspec reads, and the stepped
filter copy filling the slots stage_index gives; the forward kernel's variant (thread 0's
operands moved first, the others' twiddles of steps u >= 8 turned by -i) giving the same pairs
and the same twiddle bits; the program also feeds the checks deliberately wrong maps and fails
unless every one is rejected. And the forward kernel's p1 input map (tests/p1_pairs_check.cu):
each thread's pairs tile the sequence's nonzero half once."""

import shutil
import subprocess
from pathlib import Path

import pytest

from monarch_fftconv import _extension

NVCC = shutil.which("nvcc")
SOURCE = Path(__file__).resolve().parent / "pair_sweep_check.cu"
P1_PAIRS_SOURCE = Path(__file__).resolve().parent / "p1_pairs_check.cu"

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


def test_forward_p1_pairs_tile_the_sequence_once(tmp_path):
    """p1's input pairs over every thread tile [0, M) once (tests/p1_pairs_check.cu): what lets the
    own-pairs staging (-DMONARCH_FFTCONV_FWD_OWN_PAIRS=1) skip the CTA barrier; every plan size."""
    out = build_and_run(P1_PAIRS_SOURCE, tmp_path)
    rejected = [line for line in out.splitlines() if line.startswith("wrong:") and line.endswith(" rejected")]
    # the zero half at each of the 8 sizes; q at the 5 with two or more butterflies a thread
    assert len(rejected) == 8 + 5


def test_forward_p1_reads_the_pairs_the_staging_copies():
    """p1_pair_start is what the own-pairs staging copies (and what the host check tiles);
    forward_p1 writes the same map out (a call moved ptxas's allocation). Read from the source,
    with forward_p1's names (M = P::M, R = P::R1, j = tx + q·T) bound: the two must be one formula,
    or p1 would read pairs no thread staged, after no barrier."""
    import re

    source = (Path(__file__).resolve().parents[1] / "monarch_fftconv" / "csrc" / "fp32" / "forward_stages.cuh").read_text()
    staged = re.search(r"int p1_pair_start\(int j, int r\) \{.*?return (.*?);", source, re.S).group(1)
    body = source[source.index("void forward_p1("):]
    body = body[: body.index("\n}\n")]
    read = re.search(r"const int t0 = (.*?);", body).group(1)
    assert "constexpr int M = P::M" in body and "constexpr int R = P::R1" in body and "const int j = tx + q * T;" in body
    assert staged.replace("P::M", "M").replace("P::R1", "R").replace(" ", "") == read.replace(" ", "")
    assert "p1_pair_start<LOGM>(tx + q * P::T, r)" in source  # the staging's j is forward_p1's
